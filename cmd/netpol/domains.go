package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/pkg/dnssnoop"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/node"
)

// Domain tables: `netpol table --domains` (the evaluator, names resolved
// from the lab's zone) and `netpol lab probe --domains` (the kernel: each
// name resolved from inside the pod through the cluster DNS, then a
// connection to its first address).

// domainResults is the JSON shape of both: {"results": [row, ...]}.
type domainResults struct {
	Results []conformance.DomainRow `json:"results"`
}

// expectedDomains are the evaluator's domain rows for the loaded state.
func expectedDomains(l *loaded, probes []l4.Port, tcp bool) ([]conformance.DomainRow, error) {
	zone, err := lab.ZoneOf(l.snap)
	if err != nil {
		return nil, err
	}
	if zone == nil {
		return nil, errors.New("--domains needs the lab's zone: ConfigMap kube-system/netpol-lab-dns with data.zone (see examples/lab-dns.yaml)")
	}
	if probes, err = probesOrDeclared(l, probes); err != nil {
		return nil, err
	}
	l.evaluator.LearnDomains(conformance.ZoneOracle(zone))
	return conformance.ExpectedDomains(l.evaluator, l.snap, zone, conformance.DomainProbeOptions{Probes: probes, TCP: tcp})
}

// writeDomainRows prints domain rows: JSON or YAML as {"results": [...]},
// else a line per row.
func writeDomainRows(out io.Writer, rows []conformance.DomainRow, format string) error {
	if ok, err := writeStructured(out, format, domainResults{rows}); ok {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "FROM\tTO\tPORT\tALLOWED\tADDRESS\tRESULT")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s/%d\t%v\t%s\t%s\n", r.From, r.To, strings.ToLower(r.Protocol), r.Port, r.Allowed, r.Address, r.Result)
	}
	return w.Flush()
}

// probeDomains runs `lab probe --domains`: a lab with the zone served and
// the nodes learning from DNS, every pod resolving every name and
// connecting; with compare, the evaluator's rows too and an error when
// they differ.
func probeDomains(ctx context.Context, cmd *cobra.Command, in *inputFlags, prefix string, probes []l4.Port, tcp, compare bool, output string) error {
	l, lb, enf, probes, err := startLabWith(ctx, cmd, in, prefix, probes, true, nil)
	if err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	zone := lb.Zone()
	if zone == nil {
		enf.Close()
		return errors.Join(errors.New("--domains needs the lab's zone: ConfigMap kube-system/netpol-lab-dns with data.zone (see examples/lab-dns.yaml)"), lb.Down())
	}
	fmt.Fprintf(stderr, "lab %s: resolving %d name(s) from every pod and connecting on %d port(s)\n", lb.Prefix(), len(zone.Names()), len(probes))
	observed, probeErr := conformance.ProbeDomains(ctx, lb, conformance.DomainProbeOptions{Probes: probes, TCP: tcp})
	for name, st := range enf.DNSStatus() {
		if st != nil {
			fmt.Fprintf(stderr, "node %s: %s; %d answer(s) read, %d address(es) learned\n", name, st.Queue, st.Stats.Answers, st.Stats.Known)
		}
	}
	enf.Close()
	size := labSize(lb)
	if err := errors.Join(probeErr, lb.Down()); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "lab %s removed: %s\n", lb.Prefix(), size)
	out := cmd.OutOrStdout()
	if !compare {
		if err := writeDomainRows(out, observed, output); err != nil {
			return err
		}
		return l.done()
	}
	expected, err := expectedDomains(l, probes, tcp)
	if err != nil {
		return err
	}
	diffs := conformance.CompareDomains(expected, observed)
	if err := writeDomainRows(out, observed, output); err != nil {
		return err
	}
	for _, d := range diffs {
		fmt.Fprintln(stderr, "differs:", d)
	}
	if len(diffs) > 0 {
		return fmt.Errorf("the kernel disagrees with the evaluator on %d domain probe(s)", len(diffs))
	}
	fmt.Fprintf(stderr, "the kernel agrees with the evaluator on all %d domain probe(s)\n", len(observed))
	return l.done()
}

// learnDomains gives the evaluator what DNS taught: from an agent's
// /debug/dns (a URL or a saved file) when from is set, else from the
// lab's zone when the state has one.
func learnDomains(ctx context.Context, l *loaded, from string) error {
	if from == "" {
		zone, err := lab.ZoneOf(l.snap)
		if err != nil || zone == nil {
			return err
		}
		l.evaluator.LearnDomains(conformance.ZoneOracle(zone))
		return nil
	}
	var data []byte
	var err error
	if strings.HasPrefix(from, "http://") || strings.HasPrefix(from, "https://") {
		data, err = httpGet(ctx, from)
	} else {
		data, err = os.ReadFile(from)
	}
	if err != nil {
		return fmt.Errorf("--learned %s: %w", from, err)
	}
	var st node.DNSStatus
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("--learned %s: not an agent's /debug/dns JSON: %w", from, err)
	}
	l.evaluator.LearnDomains(dnssnoop.Learned{Entries: st.Entries, Now: time.Now()})
	return nil
}

// httpGet fetches url's body (an agent's debug port).
func httpGet(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return body, err
}
