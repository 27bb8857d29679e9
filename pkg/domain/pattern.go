// Package domain is what netpol knows of domain names: the
// ClusterNetworkPolicy domainNames patterns and how a name matches them,
// and what a DNS answer teaches (which addresses a name resolved to, for
// how long), read from the answers the cluster DNS sends to pods (UDP
// datagrams, or a TCP stream put back together); and the zone the lab's
// DNS server serves (zone.go: A, AAAA and CNAME records read from a
// master file, answered as an authoritative server would).
package domain

import (
	"errors"
	"fmt"
	"strings"
)

// Pattern is one domainNames entry: a fully qualified name, or "*."
// followed by one, where the "*" stands for one or more whole labels
// ("*.example.com" matches "a.example.com" and "a.b.example.com", not
// "example.com"). Matching ignores case and a trailing dot.
type Pattern struct {
	name     string // lower case, no trailing dot; after "*." for a wildcard
	wildcard bool
}

// ParsePattern reads a domainNames entry. It takes what the API's
// validation takes (RFC 1123 labels of letters, digits and hyphens, "*"
// only as the whole first label, at least two labels after it or one for
// an exact name) and an optional trailing dot.
func ParsePattern(s string) (Pattern, error) {
	name, wildcard := strings.CutPrefix(s, "*.")
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return Pattern{}, fmt.Errorf("domain name %q: empty", s)
	}
	if len(name) > 253 {
		return Pattern{}, fmt.Errorf("domain name %q: longer than 253 characters", s)
	}
	labels := strings.Split(name, ".")
	if wildcard && len(labels) < 2 {
		return Pattern{}, fmt.Errorf("domain name %q: a wildcard needs at least two labels after it", s)
	}
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return Pattern{}, fmt.Errorf("domain name %q: %w", s, err)
		}
	}
	return Pattern{name: strings.ToLower(name), wildcard: wildcard}, nil
}

func checkLabel(l string) error {
	switch {
	case l == "":
		return errors.New("empty label")
	case l == "*":
		return errors.New(`"*" only as the whole first label`)
	case len(l) > 63:
		return fmt.Errorf("label %q longer than 63 characters", l)
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Errorf("label %q starts or ends with a hyphen", l)
	}
	for _, c := range l {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("label %q has %q (letters, digits and hyphens only)", l, c)
		}
	}
	return nil
}

// Matches reports whether a name (any case, trailing dot or not) is one
// the pattern admits.
func (p Pattern) Matches(name string) bool {
	name = Normalize(name)
	if !p.wildcard {
		return name == p.name
	}
	rest, ok := strings.CutSuffix(name, "."+p.name)
	return ok && rest != "" && !strings.HasPrefix(rest, ".") && !strings.HasSuffix(rest, ".")
}

// Wildcard reports whether the pattern is "*." and a name.
func (p Pattern) Wildcard() bool { return p.wildcard }

// String is the pattern in canonical form (lower case, no trailing dot).
func (p Pattern) String() string {
	if p.wildcard {
		return "*." + p.name
	}
	return p.name
}

// Normalize is a name as patterns compare it: lower case, no trailing
// dot.
func Normalize(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}
