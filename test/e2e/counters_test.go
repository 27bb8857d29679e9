//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/internal/syncbuf"
	"github.com/netpol/netpol/pkg/lab"
)

// TestAgentRuleCounters: the agent counts each policy rule's decisions
// (on by default): a NetworkPolicy's isolation and its allow rule, each by
// exactly the connections made, in netpol_policy_rule_packets_total with
// the policy's kind, namespace, name, rule, action and direction; and
// `netpol model watch` shows them beside the rules that count into them.
func TestAgentRuleCounters(t *testing.T) {
	w := newWorld(t, "e2e")
	a := w.agent["node-1"] // x/b's node: its ingress is judged there
	w.apply(bFromC(""))
	to := netip.AddrPortFrom(w.podAddr("x/b"), 80)
	dial := func(from string, sport uint16) bool {
		return w.lab.Dial(context.Background(), from, to, corev1.ProtocolUDP, lab.DialOptions{SourcePort: sport, Timeout: 300 * time.Millisecond}).Allowed
	}
	deadline := time.Now().Add(30 * time.Second)
	for sport := uint16(45000); dial("x/a", sport); sport++ {
		if time.Now().After(deadline) {
			t.Fatal("the policy was not enforced within 30 s")
		}
	}
	const labels = `{action="%s",direction="ingress",kind="NetworkPolicy",name="b-from-c",namespace="x",rule="%s"}`
	isolation := "netpol_policy_rule_packets_total" + fmt.Sprintf(labels, "Deny", "isolation")
	allow := "netpol_policy_rule_packets_total" + fmt.Sprintf(labels, "Accept", "ingress[0]")
	denied0, allowed0 := a.metric(t, isolation), a.metric(t, allow)
	if denied0 < 1 {
		t.Fatalf("%s = %v after a denied connection", isolation, denied0)
	}
	const denials, allows = 3, 2
	for i := range denials {
		if dial("x/a", uint16(45100+i)) {
			t.Fatal("x/a -> x/b allowed")
		}
	}
	for i := range allows {
		if !dial("x/c", uint16(45200+i)) {
			t.Fatal("x/c -> x/b denied")
		}
	}
	if got := a.metric(t, isolation) - denied0; got != denials {
		t.Errorf("%s grew by %v, want %d", isolation, got, denials)
	}
	if got := a.metric(t, allow) - allowed0; got != allows {
		t.Errorf("%s grew by %v, want %d", allow, got, allows)
	}
	if got := a.metric(t, "netpol_policy_rule_bytes_total"+fmt.Sprintf(labels, "Accept", "ingress[0]")); got < 28*(allowed0+allows) {
		t.Errorf("bytes of %s: %v", allow, got)
	}

	// model watch: the model, then the rules beside their counters.
	out := &syncbuf.Buffer{}
	cmd := exec.Command(netpolBin, "model", "watch", "--agent", a.debug)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	seen := func() bool { return strings.Contains(out.String(), " counters\n= chain ") }
	for deadline := time.Now().Add(10 * time.Second); !seen() && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	if !seen() {
		t.Fatalf("model watch printed no counters:\n%s", out)
	}
	// One more denial: the next counters line shows it, with what it grew by.
	before := len(out.String())
	if dial("x/a", 45300) {
		t.Fatal("x/a -> x/b allowed")
	}
	grew := func() bool {
		return strings.Contains(out.String()[before:], "packets (+1), ") && strings.Contains(out.String()[before:], ": NetworkPolicy x/b-from-c isolation Deny (ingress)")
	}
	for deadline := time.Now().Add(10 * time.Second); !grew() && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	if !grew() {
		t.Errorf("model watch did not show the isolation's counter grow by one:\n%s", out)
	}
	first := out.String()
	var shown []string
	for l := range strings.SplitSeq(first, "\n") {
		if strings.HasPrefix(l, "= ") || strings.HasSuffix(l, " counters") {
			shown = append(shown, l)
		}
	}
	t.Logf("model watch, its counters lines:\n%s", strings.Join(shown, "\n"))
	if !strings.Contains(first, `: NetworkPolicy x/b-from-c ingress[0] Accept (ingress)`) || !strings.Contains(first, `counter name "rule.`) {
		t.Errorf("model watch's counters lack the allow rule's:\n%s", first)
	}
}
