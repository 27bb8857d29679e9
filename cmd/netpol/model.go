package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netpol/netpol/pkg/agent"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/node"
)

func newModelCommand(in *inputFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Look at a running agent's compiled model",
	}
	var (
		addr        string
		interval    time.Duration
		kubeContext string
		insecure    bool
		caFile      string
	)
	watch := &cobra.Command{
		Use:   "watch",
		Short: "Print the node's model, then a + or - line for every rule and set element that changes",
		Long: "Follow an agent's model (its /debug/model watch stream): print it, then a + or - line for every rule\n" +
			"and set element that changes, and an = line for each rule beside its per-rule counter when the\n" +
			"counter grows (every 2 s at most: its packets, what they grew by, its bytes and the policy rule).\n" +
			"On the node: the agent's debug address (plain HTTP, 127.0.0.1:9755 by default). From elsewhere:\n" +
			"its secure port, https://NODE:PORT, with the kubeconfig's credentials (a bearer token, a token file\n" +
			"or an exec plugin): the agent asks the API server who the caller is and\n" +
			"whether RBAC lets them get /debug/model (nonResourceURLs: [\"/debug/*\"]). Credentials are sent\n" +
			"over https only.",
		Example: "  netpol model watch                               # the agent on this node\n" +
			"  netpol model watch --agent https://10.0.0.5:10253 --insecure-skip-tls-verify   # self-signed\n" +
			"  netpol model watch | grep '^[+-] set egress-pods4'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			u, err := agent.ModelURL(addr, false)
			if err != nil {
				return fmt.Errorf("--agent: %w", err)
			}
			client, err := modelClient(u, in.kubeconfig, kubeContext, insecure, caFile)
			if err != nil {
				return err
			}
			return watchModel(ctx, client, u, interval, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := watch.Flags()
	f.StringVar(&addr, "agent", "127.0.0.1:9755", "the agent: its debug address (host:port, plain HTTP) or its secure port (https://host:port)")
	f.DurationVar(&interval, "interval", time.Second, "the first wait before reconnecting to an agent that does not answer (doubling up to 30s)")
	f.StringVar(&kubeContext, "context", "", "kubeconfig context whose credentials go to an https agent")
	f.BoolVar(&insecure, "insecure-skip-tls-verify", false, "do not verify an https agent's certificate (a self-signed one)")
	f.StringVar(&caFile, "agent-ca-file", "", "CA bundle to verify an https agent's serving certificate")
	cmd.AddCommand(watch)
	return cmd
}

// modelClient is the HTTP client for an agent URL: plain for http, with
// the kubeconfig's credentials and the given TLS verification for https.
// No overall timeout: the watch stream is long-lived (see watchModel).
func modelClient(agentURL, kubeconfig, kubeContext string, insecure bool, caFile string) (*http.Client, error) {
	base := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: 10 * time.Second,
	}
	u, err := url.Parse(agentURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "https" {
		return &http.Client{Transport: base}, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("credentials for %s: %w", agentURL, err)
	}
	// The kubeconfig's user, not its cluster: the agent is verified by
	// --agent-ca-file (or not, with --insecure-skip-tls-verify), and no
	// client certificate is sent (the agent authenticates tokens).
	anon := &rest.Config{BearerToken: cfg.BearerToken, BearerTokenFile: cfg.BearerTokenFile,
		ExecProvider: cfg.ExecProvider, AuthProvider: cfg.AuthProvider, AuthConfigPersister: cfg.AuthConfigPersister,
		TLSClientConfig: rest.TLSClientConfig{Insecure: insecure, CAFile: caFile}, UserAgent: rest.DefaultKubernetesUserAgent()}
	if anon.BearerToken == "" && anon.BearerTokenFile == "" && anon.ExecProvider == nil && anon.AuthProvider == nil {
		return nil, fmt.Errorf("the kubeconfig's user has no token to show %s (the agent does not accept client certificates)", agentURL)
	}
	rt, err := rest.TransportFor(anon)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: rt}, nil
}

// maxBackoff is the longest wait between two attempts to reach an agent
// that does not answer.
const maxBackoff = 30 * time.Second

// idleStream is how long a watch stream may stay silent before it is
// taken for dead (the agent writes a blank line every 30s).
const idleStream = 75 * time.Second

// watchModel follows the agent's model stream at url (its /debug/model)
// and prints the model, then its changes. While the agent does not answer
// it says once what it waits for, backs off (doubling from interval, up
// to maxBackoff), and says when it answers.
func watchModel(ctx context.Context, client *http.Client, url string, interval time.Duration, out, stderr io.Writer) error {
	var prev []string
	var gen int64 = -1
	var model *agent.ModelView
	counted := map[string]nft.CounterValue{} // the counters printed, by name
	wait, failing := interval, ""
	for {
		got := false
		err := streamModel(ctx, client, url, func(m *agent.ModelView) {
			got = true
			if failing != "" {
				fmt.Fprintf(stderr, "the agent at %s answers\n", url)
				failing = ""
			}
			if m.IsCounters() {
				printCounters(out, model, m, counted)
				return
			}
			if m.Generation == gen {
				return
			}
			model = m
			lines := m.Lines()
			diff := agent.DiffLines(prev, lines)
			if len(diff) > 0 || gen < 0 {
				fmt.Fprintf(out, "# %s node %s generation %d\n", time.Now().Format(time.RFC3339), m.Node, m.Generation)
			}
			for _, l := range diff {
				fmt.Fprintln(out, l)
			}
			prev, gen = lines, m.Generation
		})
		if ctx.Err() != nil {
			return nil
		}
		var fatal *fatalError
		if errors.As(err, &fatal) {
			return fatal.err
		}
		if got {
			wait = interval // it answered: reconnect soon
		} else {
			wait = min(2*wait, maxBackoff)
		}
		if err == nil {
			err = errors.New("the stream ended")
		}
		if failing == "" {
			fmt.Fprintf(stderr, "waiting for the agent at %s (%v); retrying with backoff up to %s\n", url, err, maxBackoff)
		}
		failing = err.Error()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// counterRef finds the counters a rule's text counts into.
var counterRef = regexp.MustCompile(`counter name "([^"]+)"`)

// printCounters prints a counters line of the stream: each rule of the
// model that counts into a counter that changed, beside its value (and
// what it grew by since last printed) and the policy rule it counts.
func printCounters(out io.Writer, model, m *agent.ModelView, counted map[string]nft.CounterValue) {
	if model == nil {
		return
	}
	byName := make(map[string]node.RuleCount, len(m.Counters))
	for _, c := range m.Counters {
		byName[c.Counter] = c
	}
	var lines []string
	for chain, rules := range model.Chains {
		for i, r := range rules {
			for _, ref := range counterRef.FindAllStringSubmatch(r, -1) {
				c, ok := byName[ref[1]]
				if !ok {
					continue
				}
				grew := ""
				if last, ok := counted[c.Counter]; ok && c.Packets >= last.Packets {
					grew = fmt.Sprintf(" (+%d)", c.Packets-last.Packets)
				}
				lines = append(lines, fmt.Sprintf("= chain %s [%d] %s   # %d packets%s, %d bytes: %s %s %s (%s)",
					chain, i, r, c.Packets, grew, c.Bytes, c.Policy(), c.Rule, c.Action, c.Direction))
			}
		}
	}
	for _, c := range m.Counters {
		counted[c.Counter] = c.CounterValue
	}
	if len(lines) == 0 {
		return
	}
	sort.Strings(lines)
	fmt.Fprintf(out, "# %s node %s counters\n", time.Now().Format(time.RFC3339), m.Node)
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
}

// fatalError is an answer retrying cannot change (401, 403).
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// streamModel reads one watch stream until it ends, calling each for every
// model in it.
func streamModel(ctx context.Context, client *http.Client, url string, each func(*agent.ModelView)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"?watch=true", nil)
	if err != nil {
		return &fatalError{err}
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		err := fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			return &fatalError{err}
		}
		return err
	}
	idle := time.AfterFunc(idleStream, cancel)
	defer idle.Stop()
	dec := json.NewDecoder(&activity{r: resp.Body, seen: func() { idle.Reset(idleStream) }})
	for {
		m := &agent.ModelView{}
		if err := dec.Decode(m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		each(m)
	}
}

// activity calls seen whenever bytes arrive (the keepalive lines too).
type activity struct {
	r    io.Reader
	seen func()
}

func (a *activity) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.seen()
	}
	return n, err
}
