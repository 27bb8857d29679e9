package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/probe"
)

// newProbeCommand is the probe protocol inside a pod: what the conformance
// suite's cluster runner runs (netpol's own image, no third-party one).
func newProbeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Probe servers and clients for conformance runs in a cluster's pods",
		Long: `netpol probe serve answers on the given ports with the pod's namespace/name
(TCP and SCTP write it and close, UDP replies to each datagram); netpol probe
dial connects to targets in parallel and prints one JSON array of outcomes.
The conformance suite's cluster runner runs serve as each probe pod's
command and dial through exec.`,
	}
	cmd.AddCommand(newProbeServeCommand(), newProbeDialCommand())
	annotate(cmd, inputNone)
	return cmd
}

func newProbeServeCommand() *cobra.Command {
	var (
		owner string
		ports []string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Answer probes on every address of this network namespace until stopped",
		Example: "  netpol probe serve --ports tcp/80,udp/80,sctp/80\n" +
			"  POD_NAMESPACE=x POD_NAME=a netpol probe serve   # the owner from the downward API",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if owner == "" {
				owner = defaultOwner()
			}
			probes, err := l4.ParsePorts(ports)
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			var servers []*probe.Server
			for _, pr := range probes {
				if pr.Protocol == corev1.ProtocolSCTP {
					if ok, why := probe.SCTPSupported(); !ok {
						fmt.Fprintf(stderr, "probe: not serving %s: %s\n", pr, why)
						continue
					}
				}
				// Both families where the pod has them: IPv6 is optional.
				for _, any := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
					s, err := probe.Serve(netns.None(), owner, any, pr)
					if err != nil {
						if any.Is6() {
							fmt.Fprintf(stderr, "probe: not serving %s on IPv6: %v\n", pr, err)
							continue
						}
						return err
					}
					servers = append(servers, s)
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "probe: %s serving %d sockets\n", owner, len(servers))
			ctx, cancel := signalContext(cmd.Context())
			defer cancel()
			<-ctx.Done()
			return probe.StopServers(servers)
		},
	}
	f := cmd.Flags()
	f.StringVar(&owner, "owner", "", "what to answer (default $POD_NAMESPACE/$POD_NAME, else the host name)")
	f.StringSliceVar(&ports, "ports", []string{"tcp/80", "tcp/81", "udp/80", "udp/81", "sctp/80", "sctp/81"}, "PROTO/PORT to serve")
	return cmd
}

// defaultOwner is the pod's namespace/name from the downward API.
func defaultOwner() string {
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns != "" && name != "" {
		return ns + "/" + name
	}
	host, _ := os.Hostname()
	return host
}

func newProbeDialCommand() *cobra.Command {
	var (
		timeout, retry time.Duration
	)
	cmd := &cobra.Command{
		Use:   "dial TARGET...",
		Short: "Probe every target at once and print the outcomes as one JSON array",
		Long: `Probe every TARGET (NAME=ADDR:PROTO/PORT: the owner the server must answer
with, its address, protocol and port) from this network namespace, all at
once; a target that fails is tried once more with --retry-timeout. Prints
[{"to", "address", "protocol", "port", "allowed", "result", "reply"}, ...]
in the targets' order; allowed means the target's own server answered.`,
		Example: "  netpol probe dial x/b=10.244.1.11:tcp/80 x/b=10.244.1.11:udp/80",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			targets := make([]probe.Target, 0, len(args))
			for _, a := range args {
				t, err := probe.ParseTarget(a)
				if err != nil {
					return err
				}
				targets = append(targets, t)
			}
			out := probe.DialAll(cmd.Context(), targets, probe.DialOptions{Timeout: timeout, RetryTimeout: retry})
			return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&timeout, "timeout", 500*time.Millisecond, "one attempt's timeout")
	f.DurationVar(&retry, "retry-timeout", 1500*time.Millisecond, "the second attempt's timeout for targets that failed (0: no retry)")
	return cmd
}
