//go:build bench_peers

package peers

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// markdown renders the results as one table per size with the ratios
// netpol / kube-proxy for each figure (times and memory: below 1 is
// netpol better; connections per second: above 1).
func markdown(results []result, syncTimeout time.Duration) string {
	var b strings.Builder
	type key struct{ services, endpoints int }
	var order []key
	bySize := map[key]map[string]result{}
	for _, r := range results {
		k := key{r.Services, r.Endpoints}
		if bySize[k] == nil {
			bySize[k] = map[string]result{}
			order = append(order, k)
		}
		bySize[k][r.System] = r
	}
	peers := []string{"kube-proxy-nftables", "kube-proxy-iptables"}
	for _, k := range order {
		rs := bySize[k]
		fmt.Fprintf(&b, "%s Services x %d endpoints:\n\n", thousands(float64(k.services)), k.endpoints)
		b.WriteString("| figure | netpol | kube-proxy nftables | kube-proxy iptables | netpol / nftables | netpol / iptables |\n")
		b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: |\n")
		type figure struct {
			name  string
			value func(result) *float64
			show  func(float64) string
			// dnf: a time figure whose "did not finish" is a bound.
			dnf bool
		}
		figures := []figure{
			{"first full sync", func(r result) *float64 { return r.FullSyncSeconds }, seconds, true},
			{"one Service added, p50", func(r result) *float64 { return r.AddOneServiceP50Seconds }, seconds, false},
			{"peak RSS (VmHWM)", func(r result) *float64 {
				if r.PeakRSSBytes == nil {
					return nil
				}
				return ptr(float64(*r.PeakRSSBytes))
			}, mib, false},
			{"TCP connections/s via a ClusterIP", func(r result) *float64 { return r.ConnPerSecond }, thousands, false},
		}
		for _, f := range figures {
			row := []string{f.name}
			cell := func(system string) string {
				r, ok := rs[system]
				switch {
				case !ok:
					return "not run"
				case f.dnf && unfinished(r):
					return "did not finish in " + shortDuration(syncTimeout)
				case f.value(r) != nil && unfinished(r):
					// The peak RSS over a capped run: no ratio.
					return f.show(*f.value(r)) + " (sync unfinished)"
				case f.value(r) != nil:
					return f.show(*f.value(r))
				}
				return "—"
			}
			for _, s := range append([]string{"netpol"}, peers...) {
				row = append(row, cell(s))
			}
			for _, peer := range peers {
				np, pr := rs["netpol"], rs[peer]
				var a, c *float64
				if _, ok := rs["netpol"]; ok {
					a = f.value(np)
				}
				if _, ok := rs[peer]; ok {
					c = f.value(pr)
				}
				switch {
				case a != nil && f.dnf && unfinished(pr):
					row = append(row, "< "+ratio(*a/syncTimeout.Seconds()))
				case a != nil && c != nil && *c > 0 && !unfinished(np) && !unfinished(pr):
					row = append(row, ratio(*a / *c))
				default:
					row = append(row, "—")
				}
			}
			b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
		b.WriteString("\n")
		b.WriteString(roundsTable(rs))
	}
	return b.String()
}

// roundsTable shows the interleaved connection rounds of one size: each
// system's median, range and proxy CPU per window, and its ratio to
// kube-proxy nftables round by round (median and range).
func roundsTable(rs map[string]result) string {
	var names []string
	for _, s := range systems {
		if r, ok := rs[s.name]; ok && len(r.ConnRounds) > 0 {
			names = append(names, s.name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	var b strings.Builder
	rounds := len(rs[names[0]].ConnRounds)
	fmt.Fprintf(&b, "TCP connections/s via a ClusterIP, %d interleaved rounds of %v (each system alone, the others stopped):\n\n", rounds, connWindow)
	b.WriteString("| system | median | min-max | proxy CPU per window (median) | / kube-proxy nftables, per round: median (min-max) |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: |\n")
	peer := rs["kube-proxy-nftables"].ConnRounds
	for _, name := range names {
		r := rs[name]
		against := "—"
		if len(peer) == len(r.ConnRounds) && name != "kube-proxy-nftables" {
			var ratios []float64
			for i, x := range r.ConnRounds {
				if peer[i] > 0 {
					ratios = append(ratios, x/peer[i])
				}
			}
			if len(ratios) > 0 {
				against = fmt.Sprintf("%s (%s-%s)", ratio(median(ratios)), ratio(slices.Min(ratios)), ratio(slices.Max(ratios)))
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s-%s | %.2f s | %s |\n", name, thousands(median(r.ConnRounds)),
			thousands(slices.Min(r.ConnRounds)), thousands(slices.Max(r.ConnRounds)), median(r.ConnCPUSeconds), against)
	}
	b.WriteString("\n")
	return b.String()
}

// unfinished: the system's full sync hit the cap.
func unfinished(r result) bool {
	return r.FullSyncSeconds == nil && strings.Contains(r.Note, "did not finish")
}

func seconds(s float64) string {
	switch {
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1000)
	case s < 100:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.0f s", s)
}

func mib(b float64) string { return fmt.Sprintf("%.0f MiB", b/(1<<20)) }

func ratio(x float64) string {
	switch {
	case x >= 10:
		return fmt.Sprintf("%.0f", x)
	case x >= 0.1:
		return fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.2g", x)
}

// thousands: 12345.6 -> "12,346".
func thousands(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func shortDuration(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%d min", int(d.Minutes()))
	}
	return d.String()
}
