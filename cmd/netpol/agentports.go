package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// agentPortFlags are `netpol agent --protect-agent-ports`'s, for the
// commands that compile, explain or trace a node's table as that agent
// programs it.
type agentPortFlags struct {
	ports []uint
	allow []string
}

func (a *agentPortFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.UintSliceVar(&a.ports, "protect-agent-ports", nil, "the agent's TCP ports its table protects, as `netpol agent --protect-agent-ports` does (the agent: its metrics, debug and secure ports not on loopback)")
	f.StringSliceVar(&a.allow, "agent-ports-allow", nil, "with --protect-agent-ports: networks that may reach them besides the node itself")
}

// parse is the protection the flags describe; nil without ports.
func (a *agentPortFlags) parse() (*compiler.AgentPorts, error) {
	if len(a.ports) == 0 {
		if len(a.allow) > 0 {
			return nil, fmt.Errorf("--agent-ports-allow needs --protect-agent-ports")
		}
		return nil, nil
	}
	ap := &compiler.AgentPorts{}
	for _, p := range a.ports {
		if p == 0 || p > 65535 {
			return nil, fmt.Errorf("--protect-agent-ports: %d is not a port", p)
		}
		ap.Ports = append(ap.Ports, uint16(p))
	}
	var err error
	if ap.Allowed, err = parseList(a.allow, parsePrefixOrAddr); err != nil {
		return nil, fmt.Errorf("--agent-ports-allow: %w", err)
	}
	return ap, nil
}

// connectionArgs checks the output format of a command about one
// connection (text, json or yaml) and reads its --port.
func connectionArgs(output, port string) (l4.Port, error) {
	if err := checkFormat(output, "text", "json", "yaml"); err != nil {
		return l4.Port{}, err
	}
	return l4.ParsePort(port)
}

// loadGuarded reads the cluster state (in) and makes its evaluator judge
// node addresses as tables that protect the agent's ports (a) do; it
// returns those ports too (nil: not protected). The flags are checked
// before the state is read.
func loadGuarded(cmd *cobra.Command, in *inputFlags, a *agentPortFlags) (*loaded, *compiler.AgentPorts, error) {
	ap, err := a.parse()
	if err != nil {
		return nil, nil, err
	}
	l, err := in.load(cmd.Context(), cmd.InOrStdin(), cmd.ErrOrStderr())
	if err != nil {
		return nil, nil, err
	}
	l.guard(ap)
	return l, ap, nil
}

// promoted is l with its staged policies enforced (policy.Promoted),
// guarded as l is by ap; it learns no domains yet (learnDomains).
func (l *loaded) promoted(ap *compiler.AgentPorts) *loaded {
	model := policy.Promoted(l.model)
	p := &loaded{snap: l.snap, model: model, evaluator: eval.New(l.snap, model)}
	p.guard(ap)
	return p
}

// guard makes l's evaluator judge node addresses as tables with ap do.
func (l *loaded) guard(ap *compiler.AgentPorts) {
	if ap != nil {
		l.evaluator.GuardNodes(ap)
	}
}
