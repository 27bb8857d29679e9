package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/agent"
)

func newModelCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Look at a running agent's compiled model",
	}
	var (
		addr     string
		interval time.Duration
	)
	watch := &cobra.Command{
		Use:   "watch",
		Short: "Print the node's model, then a + or - line for every rule and set element that changes",
		Example: "  netpol model watch --agent 127.0.0.1:9754\n" +
			"  netpol model watch | grep '^[+-] set egress-pods4'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			url := addr
			if !strings.Contains(url, "://") {
				url = "http://" + url
			}
			url = strings.TrimSuffix(url, "/") + "/debug/model"
			client := &http.Client{Timeout: 5 * time.Second}
			out := cmd.OutOrStdout()
			return watchModel(ctx, client, url, interval, out, cmd.ErrOrStderr())
		},
	}
	watch.Flags().StringVar(&addr, "agent", "127.0.0.1:9754", "the agent's health address (serves /debug/model)")
	watch.Flags().DurationVar(&interval, "interval", time.Second, "how often to poll")
	cmd.AddCommand(watch)
	return cmd
}

// maxBackoff is the longest wait between two attempts to reach an agent
// that does not answer.
const maxBackoff = 30 * time.Second

// watchModel polls url every interval and prints the model, then its
// changes. While the agent does not answer it says once what it waits
// for, backs off (doubling, up to maxBackoff), and says when it answers.
func watchModel(ctx context.Context, client *http.Client, url string, interval time.Duration, out, stderr io.Writer) error {
	var prev []string
	var gen int64 = -1
	wait, failing := interval, ""
	for {
		m, err := fetchModel(client, url)
		switch {
		case err != nil:
			if failing == "" {
				fmt.Fprintf(stderr, "waiting for the agent at %s (%v); retrying with backoff up to %s\n", url, err, maxBackoff)
			}
			failing = err.Error()
			wait = min(2*wait, maxBackoff)
		default:
			if failing != "" {
				fmt.Fprintf(stderr, "the agent at %s answers\n", url)
				failing = ""
			}
			wait = interval
			if m.Generation != gen {
				lines := m.Lines()
				diff := agent.DiffLines(prev, lines)
				if len(diff) > 0 || gen < 0 {
					fmt.Fprintf(out, "# %s node %s generation %d\n", time.Now().Format(time.RFC3339), m.Node, m.Generation)
				}
				for _, l := range diff {
					fmt.Fprintln(out, l)
				}
				prev, gen = lines, m.Generation
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

func fetchModel(c *http.Client, url string) (*agent.ModelView, error) {
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	m := &agent.ModelView{}
	return m, json.NewDecoder(resp.Body).Decode(m)
}
