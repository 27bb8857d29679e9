package agent

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"gopkg.in/natefinch/lumberjack.v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

// AuditOptions are the agent's verdict log (--audit ...).
type AuditOptions struct {
	// Mode is --audit: what is logged of the policies without the
	// netpol.io/audit annotation (off, deny, all; default off). The log
	// runs whatever it is, for the policies that ask.
	Mode string
	// Group is the NFLOG group (default compiler.DefaultAuditGroup).
	Group uint16
	// Log is the file the lines go to ("" or "-": standard output),
	// rotated at MaxSizeMB into MaxFiles old files.
	Log       string
	MaxSizeMB int
	MaxFiles  int
	// Rate is the most lines a second (default audit.DefaultRate), twice
	// that at once.
	Rate float64
}

func (o *AuditOptions) defaults() {
	if o.Mode == "" {
		o.Mode = policy.AuditOff
	}
	if o.Group == 0 {
		o.Group = compiler.DefaultAuditGroup
	}
	if o.MaxSizeMB <= 0 {
		o.MaxSizeMB = 100
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = 5
	}
}

// Validate says what is wrong with the options.
func (o *AuditOptions) Validate() error {
	switch o.Mode {
	case "", policy.AuditOff, policy.AuditDeny, policy.AuditAll:
	default:
		return fmt.Errorf("--audit %q: off, deny or all", o.Mode)
	}
	if o.Rate < 0 {
		return fmt.Errorf("--audit-rate %v: a number of lines a second", o.Rate)
	}
	return nil
}

// writer is where the lines go.
func (o *AuditOptions) writer() io.WriteCloser {
	if o.Log == "" || o.Log == "-" {
		return nopCloser{os.Stdout}
	}
	return &lumberjack.Logger{Filename: o.Log, MaxSize: o.MaxSizeMB, MaxBackups: o.MaxFiles}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// programmerAudit is the programmer's verdict log, writing to l and
// naming addresses with names.
func (o *AuditOptions) programmerAudit(l *audit.Logger, names *addrNames) *node.AuditOptions {
	return &node.AuditOptions{Audit: compiler.Audit{Mode: o.Mode, Group: o.Group}, Logger: l, Name: names.name}
}

// addrNames names addresses from the informers' caches: a node's
// addresses node/NAME, a pod's namespace/name. A name is looked up in
// the pods when first asked for and kept 10 s: the verdict log asks for
// the few addresses that make connections, at most its rate a second,
// not for all of the cluster's (an index of every pod address would cost
// every agent its memory).
type addrNames struct {
	src *sources
	mu  sync.Mutex
	at  map[netip.Addr]cachedName
}

type cachedName struct {
	name string
	exp  time.Time
}

// addrNamesTTL is how long a name is kept.
const addrNamesTTL = 10 * time.Second

func (n *addrNames) name(a netip.Addr) string {
	now := time.Now()
	n.mu.Lock()
	if c, ok := n.at[a]; ok && now.Before(c.exp) {
		n.mu.Unlock()
		return c.name
	}
	if len(n.at) > 10000 {
		n.at = map[netip.Addr]cachedName{}
	}
	n.mu.Unlock()
	name := n.lookup(a)
	n.mu.Lock()
	n.at[a] = cachedName{name, now.Add(addrNamesTTL)}
	n.mu.Unlock()
	return name
}

func (n *addrNames) lookup(a netip.Addr) string {
	if n.src == nil {
		return ""
	}
	s := a.String()
	if nodes, err := n.src.listers.nodes.List(labels.Everything()); err == nil {
		for _, o := range nodes {
			node := o.(*corev1.Node)
			for _, na := range node.Status.Addresses {
				if na.Address == s && (na.Type == corev1.NodeInternalIP || na.Type == corev1.NodeExternalIP) {
					return "node/" + node.Name
				}
			}
		}
	}
	pods, err := n.src.listers.pods.List(labels.Everything())
	if err != nil {
		return ""
	}
	for _, o := range pods {
		p := o.(*leanPod)
		if !p.HostNetwork && containsIP(p.ips, s) {
			return p.Namespace + "/" + p.Name
		}
	}
	return ""
}

// containsIP says whether a comma-joined list of addresses holds ip.
func containsIP(ips, ip string) bool {
	for ips != "" {
		var one string
		one, ips, _ = strings.Cut(ips, ",")
		if one == ip {
			return true
		}
	}
	return false
}
