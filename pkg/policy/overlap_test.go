package policy_test

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/policy"
)

// cnp is an Admin ClusterNetworkPolicy named name at priority prio with
// the given subject and one ingress rule (YAML flow mappings); a rule
// with "to:" is an egress rule.
func cnp(name string, prio int, subject, rule string) string {
	direction := "ingress"
	if strings.Contains(rule, "to:") {
		direction = "egress"
	}
	return fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %s}
spec:
  tier: Admin
  priority: %d
  subject: %s
  %s: [%s]
`, name, prio, subject, direction, rule)
}

func TestSamePriorityOverlaps(t *testing.T) {
	const (
		allNS     = `{namespaces: {}}`
		teamA     = `{namespaces: {matchLabels: {team: a}}}`
		teamB     = `{namespaces: {matchLabels: {team: b}}}`
		notTeamA  = `{namespaces: {matchExpressions: [{key: team, operator: NotIn, values: [a]}]}}`
		fromAll   = `{name: r, action: Deny, from: [{namespaces: {}}]}`
		fromDev   = `{name: r, action: Accept, from: [{namespaces: {matchLabels: {env: dev}}}]}`
		fromProd  = `{name: r, action: Deny, from: [{namespaces: {matchLabels: {env: prod}}}]}`
		tcp80     = `{name: r, action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 80}}}]}`
		tcp8090   = `{name: r, action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {range: {start: 80, end: 90}}}}]}`
		udp80     = `{name: r, action: Accept, from: [{namespaces: {}}], protocols: [{udp: {destinationPort: {number: 80}}}]}`
		net10     = `{name: r, action: Deny, to: [{networks: [10.0.0.0/8]}]}`
		net10sub  = `{name: r, action: Accept, to: [{networks: [10.1.0.0/16]}]}`
		net192    = `{name: r, action: Accept, to: [{networks: [192.168.0.0/16]}]}`
		podsWeb   = `{name: r, action: Accept, to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}}]}`
		wildcard  = `{name: r, action: Accept, to: [{domainNames: ["*.example.com"]}]}`
		www       = `{name: r, action: Accept, to: [{domainNames: ["www.example.com"]}]}`
		org       = `{name: r, action: Accept, to: [{domainNames: ["example.org"]}]}`
		podsNoWeb = `{name: r, action: Deny, to: [{pods: {namespaceSelector: {}, podSelector: {matchExpressions: [{key: app, operator: DoesNotExist}]}}}]}`
	)
	tests := []struct {
		name string
		docs []string
		want []string // "first second"
	}{
		{"same priority, both from every namespace", []string{cnp("a", 10, allNS, fromAll), cnp("b", 10, allNS, fromAll)}, []string{"a b"}},
		{"different priorities", []string{cnp("a", 10, allNS, fromAll), cnp("b", 11, allNS, fromAll)}, nil},
		{"subjects apart", []string{cnp("a", 10, teamA, fromAll), cnp("b", 10, teamB, fromAll)}, nil},
		{"subjects apart by NotIn", []string{cnp("a", 10, teamA, fromAll), cnp("b", 10, notTeamA, fromAll)}, nil},
		{"subjects meet: every namespace and team a", []string{cnp("a", 10, teamA, fromAll), cnp("b", 10, allNS, fromAll)}, []string{"a b"}},
		{"peers meet: a namespace can be env dev and anything", []string{cnp("a", 10, allNS, fromDev), cnp("b", 10, allNS, fromAll)}, []string{"a b"}},
		{"peers apart: env dev and env prod", []string{cnp("a", 10, allNS, fromDev), cnp("b", 10, allNS, fromProd)}, nil},
		{"ports meet: 80 in 80-90", []string{cnp("a", 10, allNS, tcp80), cnp("b", 10, allNS, tcp8090)}, []string{"a b"}},
		{"ports apart: TCP and UDP", []string{cnp("a", 10, allNS, tcp80), cnp("b", 10, allNS, udp80)}, nil},
		{"networks meet", []string{cnp("a", 10, allNS, net10), cnp("b", 10, allNS, net10sub)}, []string{"a b"}},
		{"networks apart", []string{cnp("a", 10, allNS, net10), cnp("b", 10, allNS, net192)}, nil},
		{"pods apart: app web and no app label", []string{cnp("a", 10, allNS, podsWeb), cnp("b", 10, allNS, podsNoWeb)}, nil},
		{"domains meet: a wildcard and a name under it", []string{cnp("a", 10, allNS, wildcard), cnp("b", 10, allNS, www)}, []string{"a b"}},
		{"domains apart", []string{cnp("a", 10, allNS, wildcard), cnp("b", 10, allNS, org)}, nil},
		{"pods and networks are not compared", []string{cnp("a", 10, allNS, podsWeb), cnp("b", 10, allNS, net10)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := policy.Build(load(t, strings.Join(tc.docs, "---\n"), nil))
			if len(m.Errors) > 0 || len(m.Warnings) > 0 {
				t.Fatal(m.Errors, m.Warnings)
			}
			var got []string
			for _, o := range policy.SamePriorityOverlaps(m) {
				got = append(got, o.First.Name+" "+o.Second.Name)
				if !strings.Contains(o.String(), "the API leaves their order undefined") {
					t.Errorf("message %q", o.String())
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("overlaps %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSelectorsMeet(t *testing.T) {
	sel := func(s string) labels.Selector {
		out, err := labels.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"", "", true},
		{"team=a", "team=b", false},
		{"team=a", "team", true},
		{"team=a", "!team", false},
		{"team in (a,b)", "team notin (a)", true},
		{"team in (a)", "team notin (a)", false},
		{"tier>3", "tier<5", true},
		{"tier>3", "tier<4", false},
		{"team!=a", "env=dev", true},
	} {
		if got := policy.SelectorsMeet(sel(tc.a), sel(tc.b)); got != tc.want {
			t.Errorf("SelectorsMeet(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
	if policy.SelectorsMeet(labels.Nothing(), labels.Everything()) {
		t.Error("Nothing meets Everything")
	}
}
