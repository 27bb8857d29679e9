package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/internal/syncbuf"
	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/lab"
)

// TestLabUpAudit: `lab up --audit all --audit-log FILE` writes the demo's
// decisions as the agent would: a connection the orders NetworkPolicy
// allows and one the Admin policy denies, each named by its pods and by
// what explain names.
func TestLabUpAudit(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	const prefix = "netpol-cliaudit"
	logPath := filepath.Join(t.TempDir(), "verdicts.log")
	t.Cleanup(func() { lab.DownAll(prefix + "-") })
	ctx, cancel := context.WithCancel(context.Background())
	cmd := newRootCommand()
	out, errOut := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	cmd.SetArgs([]string{"lab", "up", "-f", demo, "-f", "../../examples/diff/staged.yaml", "--audit", "all", "--audit-log", logPath, "--prefix", prefix + "-"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("lab up: %v\n%s", err, errOut)
			}
		case <-time.After(30 * time.Second):
			t.Error("lab up still runs 30 s after Ctrl-C")
		}
	}
	defer stop()
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "lab is up"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lab up: not up in 60 s\n%s\n%s", out, errOut)
		}
	}
	st, ok, err := lab.ReadStatus(prefix)
	if err != nil || !ok {
		t.Fatalf("no status: %v", err)
	}
	pod := func(name string) lab.PodStatus {
		for _, p := range st.Pods {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no pod %s", name)
		return lab.PodStatus{}
	}
	dial := func(from, to string, port string) {
		h, err := netns.GetFromName(pod(from).NetNS)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		nsexec.In(h, func() error {
			c, err := (&net.Dialer{Timeout: 500 * time.Millisecond}).Dial("tcp", net.JoinHostPort(pod(to).Addrs[0].String(), port))
			if err == nil {
				c.Close()
			}
			return nil
		})
	}
	dial("web/frontend", "api/orders", "8080")
	dial("sandbox/toolbox", "db/postgres", "5432")
	dial("web/frontend", "sandbox/toolbox", "80") // allowed; the staged Admin Deny would deny it
	read := func() []audit.Line {
		data, _ := os.ReadFile(logPath)
		var ls []audit.Line
		for _, s := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var l audit.Line
			if s != "" && json.Unmarshal([]byte(s), &l) == nil {
				ls = append(ls, l)
			}
		}
		return ls
	}
	want := map[string]bool{
		"allow ingress web/frontend api/orders TCP 8080 NetworkPolicy NetworkPolicy api/orders-from-web ingress[0] Accept node-2":                   false,
		`deny ingress sandbox/toolbox db/postgres TCP 5432 Admin ClusterNetworkPolicy isolate-dev-from-prod ingress[0] "deny-from-dev" Deny node-2`: false,
		// The staged policy's line: the connection was allowed.
		`deny ingress web/frontend sandbox/toolbox TCP 80 Admin ClusterNetworkPolicy sandbox-not-from-web ingress[0] "deny-web" Deny node-1 staged, enforced allow`: false,
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, l := range read() {
			key := strings.Join([]string{l.Verdict, l.Direction, l.Src, l.Dst, l.Protocol, strconv.Itoa(int(l.Port)), l.Tier, l.Policy, l.Rule, l.Action, l.Node}, " ")
			if l.Staged {
				key += " staged, enforced " + l.Enforced
			}
			if _, ok := want[key]; ok {
				want[key] = true
			}
		}
		if len(keysMissing(want)) == 0 {
			break
		}
	}
	stop()
	if missing := keysMissing(want); len(missing) > 0 {
		data, _ := os.ReadFile(logPath)
		t.Errorf("the verdict log lacks:\n  %s\nit has:\n%s", strings.Join(missing, "\n  "), data)
	}
}

func keysMissing(m map[string]bool) []string {
	var out []string
	for k, seen := range m {
		if !seen {
			out = append(out, k)
		}
	}
	return out
}
