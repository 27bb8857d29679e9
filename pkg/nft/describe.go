package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file writes kernel rule expressions as text, for rules read back
// from the kernel, whose Text is not kept.

// nfVerdictMask is what of a verdict code (NF_DROP, NF_ACCEPT ... from
// include/uapi/linux/netfilter.h, which golang.org/x/sys/unix does not
// define: the library's verdict kinds) names the verdict.
const nfVerdictMask = 0xff

// VerdictCodeText is a kernel verdict code (NFTA_VERDICT_CODE; the
// library's verdict kinds) as nft writes it.
func VerdictCodeText(code int32, chain string) string {
	switch code {
	case unix.NFT_CONTINUE:
		return "continue"
	case unix.NFT_BREAK:
		return "break"
	case unix.NFT_JUMP:
		return "jump " + chain
	case unix.NFT_GOTO:
		return "goto " + chain
	case unix.NFT_RETURN:
		return "return"
	}
	switch expr.VerdictKind(code & nfVerdictMask) { // NF_DROP_ERR and NF_QUEUE_NR carry more bits
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictStolen:
		return "stolen"
	case expr.VerdictQueue:
		return "queue"
	case expr.VerdictRepeat:
		return "repeat"
	}
	return fmt.Sprintf("verdict %d", code)
}

// DescribeExprs is an nft-like text of kernel rule expressions (for rules
// read back, whose Text is not kept): not always nft's exact syntax, but
// every expression shows.
func DescribeExprs(exprs []expr.Any) string {
	var w []string
	hint := ""        // what the last load put in a register
	lastLoad := false // the previous expression loaded a key field
	load := func(text string) {
		if lastLoad && len(w) > 0 {
			w[len(w)-1] += " . " + text // a concatenated key
		} else {
			w = append(w, text)
		}
		hint, lastLoad = text, true
	}
	for i, e := range exprs {
		isLoad := false
		switch e := e.(type) {
		case *expr.Meta:
			name := metaName(e.Key)
			switch {
			case e.SourceRegister && i > 0 && isImmediate(exprs[i-1]) && len(w) > 0:
				w[len(w)-1] = "meta " + name + " set " + w[len(w)-1]
			case e.SourceRegister:
				w = append(w, "meta "+name+" set")
			case name == "nfproto" && i == 0 && loadsNetworkHeader(exprs):
				hint = "nfproto" // the implicit family match before ip/ip6 payload
			default:
				load("meta " + name)
				isLoad = true
			}
		case *expr.Cmp:
			if hint == "nfproto" {
				break
			}
			op := map[expr.CmpOp]string{expr.CmpOpEq: "", expr.CmpOpNeq: "!= ", expr.CmpOpLt: "< ",
				expr.CmpOpLte: "<= ", expr.CmpOpGt: "> ", expr.CmpOpGte: ">= "}[e.Op]
			if bw, ok := prevBitwise(exprs, i); ok && (hint == "ct state" || hint == "ct status") && e.Op == expr.CmpOpNeq && allZero(e.Data) && allZero(bw.Xor) && len(bw.Mask) == 4 {
				w[len(w)-1] = ctBitNames(hint, binary.NativeEndian.Uint32(bw.Mask)) // `ct state new,established`
				break
			}
			w = append(w, op+dataText(hint, e.Data))
		case *expr.Payload:
			load(payloadText(e))
			isLoad = true
		case *expr.Immediate:
			h := hint
			if i+1 < len(exprs) {
				if m, ok := exprs[i+1].(*expr.Meta); ok && m.SourceRegister {
					h = metaName(m.Key)
				}
			}
			w = append(w, dataText(h, e.Data))
		case *expr.Byteorder:
			isLoad = lastLoad // nft's conversion of the key just loaded: no words
		case *expr.Ct:
			if e.SourceRegister {
				w = append(w, "ct "+ctName(e.Key)+" set")
				break
			}
			load("ct " + ctName(e.Key))
			isLoad = true
		case *expr.Bitwise:
			w = append(w, "& "+dataText("", e.Mask)+" ^ "+dataText("", e.Xor))
		case *expr.Lookup:
			switch {
			case e.IsDestRegSet && e.DestRegister == 0:
				w = append(w, "vmap @"+e.SetName)
			case e.IsDestRegSet:
				w = append(w, "map @"+e.SetName)
			case e.Invert:
				w = append(w, "!= @"+e.SetName)
			default:
				w = append(w, "@"+e.SetName)
			}
		case *expr.Range:
			w = append(w, dataText(hint, e.FromData)+"-"+dataText(hint, e.ToData))
		case *expr.Verdict:
			switch e.Kind {
			case expr.VerdictJump:
				w = append(w, "jump "+e.Chain)
			case expr.VerdictGoto:
				w = append(w, "goto "+e.Chain)
			default:
				w = append(w, VerdictCodeText(int32(e.Kind), ""))
			}
		case *expr.NAT:
			if e.Type == expr.NATTypeSourceNAT {
				w = append(w, "snat")
			} else {
				w = append(w, "dnat")
			}
		case *expr.Masq:
			w = append(w, "masquerade")
		case *expr.Reject:
			w = append(w, "reject")
		case *expr.Counter:
			w = append(w, "counter")
		case *expr.Objref:
			w = append(w, fmt.Sprintf("counter name %q", e.Name))
		case *expr.Limit:
			w = append(w, fmt.Sprintf("limit rate %d/second burst %d packets", e.Rate, e.Burst))
		case *expr.Log:
			w = append(w, fmt.Sprintf("log prefix %q group %d", e.Data, e.Group))
		case *expr.Numgen:
			load(fmt.Sprintf("numgen random mod %d", e.Modulus))
			isLoad = true
		case *expr.Dynset:
			w = append(w, "update @"+e.SetName)
		case *expr.Fib:
			hint = "fib"
			w = append(w, "fib saddr type")
		default:
			w = append(w, fmt.Sprintf("%T", e))
		}
		lastLoad = isLoad
	}
	return strings.Join(w, " ")
}

func loadsNetworkHeader(exprs []expr.Any) bool {
	for _, e := range exprs {
		if p, ok := e.(*expr.Payload); ok && p.Base == expr.PayloadBaseNetworkHeader {
			return true
		}
	}
	return false
}

func prevBitwise(exprs []expr.Any, i int) (*expr.Bitwise, bool) {
	if i == 0 {
		return nil, false
	}
	bw, ok := exprs[i-1].(*expr.Bitwise)
	return bw, ok
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// ctBitNames names the bits of a ct state (or status) mask tested against
// zero: `new,established`.
func ctBitNames(what string, mask uint32) string {
	names := map[uint32]string{expr.CtStateBitINVALID: "invalid", expr.CtStateBitESTABLISHED: "established",
		expr.CtStateBitRELATED: "related", expr.CtStateBitNEW: "new", expr.CtStateBitUNTRACKED: "untracked"}
	if what == "ct status" {
		names = map[uint32]string{1: "expected", 2: "seen-reply", 4: "assured", 8: "confirmed", 16: "snat", 32: "dnat", 512: "dying"}
	}
	var w []string
	for bit := uint32(1); bit != 0; bit <<= 1 {
		if mask&bit == 0 {
			continue
		}
		if n, ok := names[bit]; ok {
			w = append(w, n)
		} else {
			w = append(w, fmt.Sprintf("0x%x", bit))
		}
	}
	return strings.Join(w, ",")
}

func isImmediate(e expr.Any) bool {
	_, ok := e.(*expr.Immediate)
	return ok
}

func metaName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyNFPROTO:
		return "nfproto"
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	case expr.MetaKeyMARK:
		return "mark"
	case expr.MetaKeyNFTRACE:
		return "nftrace"
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	}
	return fmt.Sprintf("key%d", k)
}

func ctName(k expr.CtKey) string {
	switch k {
	case expr.CtKeySTATE:
		return "state"
	case expr.CtKeySTATUS:
		return "status"
	case expr.CtKeyMARK:
		return "mark"
	case expr.CtKeyPROTODST:
		return "original proto-dst"
	case unix.NFT_CT_SRC_IP, unix.NFT_CT_SRC_IP6:
		return "original saddr"
	case unix.NFT_CT_DST_IP, unix.NFT_CT_DST_IP6:
		return "original daddr"
	}
	return fmt.Sprintf("key%d", k)
}

func payloadText(p *expr.Payload) string {
	if p.Base == expr.PayloadBaseNetworkHeader {
		switch {
		case p.Offset == 12 && p.Len == 4:
			return "ip saddr"
		case p.Offset == 16 && p.Len == 4:
			return "ip daddr"
		case p.Offset == 8 && p.Len == 16:
			return "ip6 saddr"
		case p.Offset == 24 && p.Len == 16:
			return "ip6 daddr"
		}
	}
	if p.Base == expr.PayloadBaseTransportHeader {
		switch {
		case p.Offset == 0 && p.Len == 2:
			return "th sport"
		case p.Offset == 2 && p.Len == 2:
			return "th dport"
		}
	}
	return fmt.Sprintf("@base%d,%d,%d", p.Base, p.Offset*8, p.Len*8)
}

// dataText shows a value loaded by hint: an address, a port, a protocol,
// else hex.
func dataText(hint string, b []byte) string {
	switch {
	case strings.HasSuffix(hint, "addr") && len(b) == 4:
		return netip.AddrFrom4([4]byte(b)).String()
	case strings.HasSuffix(hint, "addr") && len(b) == 16:
		return netip.AddrFrom16([16]byte(b)).String()
	case strings.HasSuffix(hint, "port") || strings.HasSuffix(hint, "proto-dst"):
		if len(b) == 2 {
			return fmt.Sprint(binary.BigEndian.Uint16(b))
		}
	case strings.HasSuffix(hint, "l4proto") && len(b) == 1:
		return ProtoName(b[0])
	case strings.HasSuffix(hint, "nftrace") && len(b) == 1:
		return fmt.Sprint(b[0])
	case strings.HasSuffix(hint, "nfproto") && len(b) == 1 && b[0] == unix.NFPROTO_IPV4:
		return "ipv4"
	case strings.HasSuffix(hint, "nfproto") && len(b) == 1 && b[0] == unix.NFPROTO_IPV6:
		return "ipv6"
	}
	return fmt.Sprintf("0x%x", b)
}
