package generator

import "slices"

// All is the whole suite, in a fixed order.
func All() []Case {
	var out []Case
	for _, family := range [](func() []Case){
		targetCases, peerCases, portCases, actionCases, ruleCases, conflictCases, namespaceCases, upstreamCases,
		adminActionCases, adminPriorityCases, adminRuleOrderCases, passCases, baselineCases,
		networksCases, nodesCases, adminPortCases, hostnetCases, churnCases,
	} {
		out = append(out, family()...)
	}
	return out
}

// HasTag reports whether c carries tag.
func (c Case) HasTag(tag string) bool { return slices.Contains(c.Tags, tag) }

// AdminTier reports whether the case uses an admin-tier or baseline-tier
// policy.
func (c Case) AdminTier() bool { return c.HasTag("admin") || c.HasTag("baseline") }

// Select keeps the cases with any tag of include (every case when include is
// empty) and no tag of exclude.
func Select(cases []Case, include, exclude []string) []Case {
	var out []Case
	for _, c := range cases {
		if len(include) > 0 && !slices.ContainsFunc(include, c.HasTag) {
			continue
		}
		if slices.ContainsFunc(exclude, c.HasTag) {
			continue
		}
		out = append(out, c)
	}
	return out
}
