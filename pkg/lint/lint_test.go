package lint_test

import (
	"slices"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/lint"
	"github.com/netpol/netpol/pkg/policy"
)

// base is a small cluster the cases' policies are linted against.
const base = `
apiVersion: v1
kind: Node
metadata: {name: node-1, labels: {role: worker}}
---
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: data, labels: {team: b}}
---
apiVersion: v1
kind: Namespace
metadata: {name: empty, labels: {team: c}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: x, labels: {app: web}}
spec:
  nodeName: node-1
  containers: [{name: c, image: i, ports: [{name: http, containerPort: 80}]}]
status: {phase: Running, podIP: 10.244.1.10, podIPs: [{ip: 10.244.1.10}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: x, labels: {app: db}}
spec:
  nodeName: node-1
  containers: [{name: c, image: i, ports: [{name: pg, containerPort: 5432}]}]
status: {phase: Running, podIP: 10.244.1.11, podIPs: [{ip: 10.244.1.11}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api, namespace: data, labels: {app: api}}
spec:
  nodeName: node-1
  containers: [{name: c, image: i}]
status: {phase: Running, podIP: 10.244.1.12, podIPs: [{ip: 10.244.1.12}]}
`

func cnp(name, tier string, prio int, subject, rules string) string {
	return "---\napiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: " + name + "}\nspec:\n  tier: " + tier +
		"\n  priority: " + itoa(prio) + "\n  subject: " + subject + "\n" + rules
}

func itoa(n int) string { return string(rune('0'+n/10)) + string(rune('0'+n%10)) }

func np(name, ns, podSelector, rules string) string {
	return "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec:\n  podSelector: " + podSelector + "\n" + rules
}

const (
	allNS   = `{namespaces: {}}`
	teamA   = `{namespaces: {matchLabels: {team: a}}}`
	denyAll = "  ingress:\n  - {name: all, action: Deny, from: [{namespaces: {}}]}\n"
)

func TestLint(t *testing.T) {
	tests := []struct {
		name string
		kind lint.Kind
		docs string
		want []string // "object field"
	}{
		{"a later rule of the policy under an earlier one", lint.ShadowedRule,
			cnp("p", "Admin", 10, allNS, "  ingress:\n  - {name: all, action: Deny, from: [{namespaces: {}}]}\n  - {name: a, action: Accept, from: [{namespaces: {matchLabels: {team: a}}}]}\n"),
			[]string{"ClusterNetworkPolicy p spec.ingress[1]"}},
		{"an earlier rule that covers part only", lint.ShadowedRule,
			cnp("p", "Admin", 10, allNS, "  ingress:\n  - {name: a, action: Deny, from: [{namespaces: {matchLabels: {team: a}}}]}\n  - {name: all, action: Accept, from: [{namespaces: {}}]}\n"),
			nil},
		{"a lower-priority Admin policy under a higher one", lint.ShadowedRule,
			cnp("first", "Admin", 10, allNS, denyAll) + cnp("second", "Admin", 20, teamA, "  ingress:\n  - {name: web, action: Accept, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}}]}\n"),
			[]string{"ClusterNetworkPolicy second spec.ingress[0]"}},
		{"a higher-priority policy on other subjects", lint.ShadowedRule,
			cnp("first", "Admin", 10, teamA, denyAll) + cnp("second", "Admin", 20, allNS, "  ingress:\n  - {name: web, action: Accept, from: [{namespaces: {}}]}\n"),
			nil},
		{"a Baseline rule under an Admin Deny", lint.ShadowedRule,
			cnp("admin", "Admin", 10, allNS, denyAll) + cnp("base", "Baseline", 10, teamA, "  ingress:\n  - {name: x, action: Accept, from: [{namespaces: {matchLabels: {team: b}}}]}\n"),
			[]string{"ClusterNetworkPolicy base spec.ingress[0]"}},
		{"a Baseline rule under an Admin Pass is not shadowed", lint.ShadowedRule,
			cnp("admin", "Admin", 10, allNS, "  ingress:\n  - {name: all, action: Pass, from: [{namespaces: {}}]}\n") + cnp("base", "Baseline", 10, teamA, "  ingress:\n  - {name: x, action: Deny, from: [{namespaces: {}}]}\n"),
			nil},
		{"a NetworkPolicy rule inside an earlier one", lint.ShadowedRule,
			np("np", "x", "{}", "  ingress:\n  - from: [{podSelector: {}}]\n  - from: [{podSelector: {matchLabels: {app: web}}}]\n    ports: [{port: 80}]\n"),
			[]string{"NetworkPolicy x/np spec.ingress[1]"}},
		{"equal priorities, different actions", lint.AmbiguousPriority,
			cnp("a", "Admin", 10, allNS, denyAll) + cnp("b", "Admin", 10, teamA, "  ingress:\n  - {name: web, action: Accept, from: [{namespaces: {}}]}\n"),
			[]string{"ClusterNetworkPolicy b spec.ingress[0]"}},
		{"equal priorities, the same action", lint.AmbiguousPriority,
			cnp("a", "Admin", 10, allNS, denyAll) + cnp("b", "Admin", 10, teamA, denyAll),
			nil},
		{"equal priorities, rules apart", lint.AmbiguousPriority,
			cnp("a", "Admin", 10, allNS, "  ingress:\n  - {name: a, action: Deny, from: [{namespaces: {matchLabels: {team: a}}}]}\n") +
				cnp("b", "Admin", 10, allNS, "  ingress:\n  - {name: b, action: Accept, from: [{namespaces: {matchLabels: {team: b}}}]}\n"),
			nil},
		{"a NetworkPolicy selecting no pod", lint.SelectsNothing,
			np("np", "x", "{matchLabels: {app: nope}}", "  policyTypes: [Ingress]\n") + np("ok", "x", "{matchLabels: {app: web}}", "  policyTypes: [Ingress]\n"),
			[]string{"NetworkPolicy x/np spec.podSelector"}},
		{"an Admin subject of a namespace without pods", lint.SelectsNothing,
			cnp("p", "Admin", 10, `{namespaces: {matchLabels: {team: c}}}`, denyAll) + cnp("q", "Admin", 11, teamA, denyAll),
			[]string{"ClusterNetworkPolicy p spec.subject"}},
		{"peers matching nothing", lint.PeerMatchesNothing,
			cnp("p", "Admin", 10, allNS, "  ingress:\n  - name: r\n    action: Deny\n    from:\n    - namespaces: {matchLabels: {team: z}}\n    - pods: {namespaceSelector: {matchLabels: {team: c}}, podSelector: {}}\n    - pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}\n"+
				"  egress:\n  - name: nodes\n    action: Deny\n    to:\n    - nodes: {matchLabels: {role: control-plane}}\n    - nodes: {matchLabels: {role: worker}}\n"),
			[]string{"ClusterNetworkPolicy p spec.egress[0].to[0]", "ClusterNetworkPolicy p spec.ingress[0].from[0]", "ClusterNetworkPolicy p spec.ingress[0].from[1]"}},
		{"named ports", lint.NamedPortUnresolved,
			np("np", "x", "{matchLabels: {app: web}}", "  ingress:\n  - ports: [{port: http}, {port: pg}]\n  egress:\n  - to: [{podSelector: {matchLabels: {app: db}}}]\n    ports: [{port: pg}, {port: http}]\n"),
			[]string{"NetworkPolicy x/np spec.egress[0].ports[1]", "NetworkPolicy x/np spec.ingress[0].ports[1]"}},
		{"domainNames outside Admin and outside Accept", lint.DomainNames,
			cnp("base", "Baseline", 10, allNS, "  egress:\n  - {name: d, action: Accept, to: [{domainNames: [example.com]}]}\n") +
				cnp("deny", "Admin", 10, allNS, "  egress:\n  - {name: d, action: Deny, to: [{domainNames: [example.com]}]}\n") +
				cnp("ok", "Admin", 11, allNS, "  egress:\n  - {name: d, action: Accept, to: [{domainNames: [example.com]}]}\n"),
			[]string{"ClusterNetworkPolicy base spec.egress[0].to[0].domainNames", "ClusterNetworkPolicy deny spec.egress[0].to[0].domainNames"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := cluster.New()
			if r := snap.AddDocuments([]byte(base+tc.docs), "test.yaml", false); len(r.Errors) > 0 {
				t.Fatal(r.Errors)
			}
			var got []string
			for _, w := range lint.Run(snap, policy.Build(snap)) {
				if w.Kind == tc.kind {
					got = append(got, w.Object.String()+" "+w.Field)
					t.Log(w)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s warnings:\n got %q\nwant %q", tc.kind, got, tc.want)
			}
		})
	}
}
