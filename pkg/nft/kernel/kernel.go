package kernel

import (
	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// Mappings between nft's names and the library's values.
var (
	chainTypes = map[string]nftables.ChainType{
		"filter": nftables.ChainTypeFilter,
		"nat":    nftables.ChainTypeNAT,
		"route":  nftables.ChainTypeRoute,
	}
	hookNums = map[string]nftables.ChainHook{
		"prerouting":  unix.NF_INET_PRE_ROUTING,
		"input":       unix.NF_INET_LOCAL_IN,
		"forward":     unix.NF_INET_FORWARD,
		"output":      unix.NF_INET_LOCAL_OUT,
		"postrouting": unix.NF_INET_POST_ROUTING,
	}
	policies = map[string]nftables.ChainPolicy{
		"accept": nftables.ChainPolicyAccept,
		"drop":   nftables.ChainPolicyDrop,
	}
	fieldTypes = map[nft.FieldType]nftables.SetDatatype{
		nft.FieldIPv4:  nftables.TypeIPAddr,
		nft.FieldIPv6:  nftables.TypeIP6Addr,
		nft.FieldProto: nftables.TypeInetProto,
		nft.FieldPort:  nftables.TypeInetService,
		// nft cannot list a concatenation with an integer field unless
		// the set carries typeof userdata, which the library does not
		// write; mark is a 32-bit host-order type that nft lists.
		nft.FieldInteger: nftables.TypeMark,
	}
)

// kernelChain is the library form of a chain (without rules).
func kernelChain(t *nftables.Table, c *nft.Chain) *nftables.Chain {
	kc := &nftables.Chain{Name: c.Name, Table: t}
	if c.Base != nil {
		h := normalHook(c.Base)
		hook := hookNums[h.Hook]
		prio := nftables.ChainPriority(h.Priority)
		policy := policies[h.Policy]
		kc.Type, kc.Hooknum, kc.Priority, kc.Policy = chainTypes[h.Type], &hook, &prio, &policy
	}
	return kc
}

// ChainHook is the Hook of a read-back base chain, nil for a regular
// chain. Unknown values keep a recognisable name so they compare unequal.
func ChainHook(kc *nftables.Chain) *nft.Hook {
	if kc.Hooknum == nil {
		return nil
	}
	h := &nft.Hook{Type: string(kc.Type), Hook: "unknown", Policy: "accept"}
	for name, num := range hookNums {
		if num == *kc.Hooknum {
			h.Hook = name
		}
	}
	if kc.Priority != nil {
		h.Priority = int(*kc.Priority)
	}
	if kc.Policy != nil && *kc.Policy == nftables.ChainPolicyDrop {
		h.Policy = "drop"
	}
	return h
}

// kernelSet is the library form of a set (without elements).
func kernelSet(t *nftables.Table, s *nft.Set) *nftables.Set {
	ks := &nftables.Set{Table: t, Name: s.Name, Interval: s.Interval, Concatenation: s.Concat(),
		KeyType: kernelType(s.Fields), HasTimeout: s.Timeout > 0, Timeout: s.Timeout, Dynamic: s.Dynamic}
	switch {
	case s.Verdict:
		ks.IsMap, ks.DataType = true, nftables.TypeVerdict
	case s.Data != nil:
		ks.IsMap, ks.DataType = true, kernelType(s.Data)
	}
	ks.Size = s.KernelSize()
	return ks
}

// heldSpec is s as the kernel holds it, without elements: Typeof is
// Render's alone (the library writes no typeof userdata).
func heldSpec(s *nft.Set) *nft.Set {
	h := s.WithElements(nil)
	h.Typeof = ""
	return h
}

// kernelType is the library type of a key or data: one type, or the
// concatenation of several.
func kernelType(fields []nft.FieldType) nftables.SetDatatype {
	if len(fields) == 1 {
		return fieldTypes[fields[0]]
	}
	types := make([]nftables.SetDatatype, len(fields))
	for i, f := range fields {
		types[i] = fieldTypes[f]
	}
	return nftables.MustConcatSetType(types...)
}

// setFlags are the kernel flags of a set with this spec.
func setFlags(s *nft.Set) uint32 {
	var f uint32
	if s.Interval {
		f |= unix.NFT_SET_INTERVAL
	}
	if s.IsMap() {
		f |= unix.NFT_SET_MAP
	}
	if s.Timeout > 0 {
		f |= unix.NFT_SET_TIMEOUT
	}
	if s.Dynamic {
		f |= unix.NFT_SET_EVAL
	}
	if s.Concat() {
		f |= nftables.NFT_SET_CONCAT
	}
	return f
}
