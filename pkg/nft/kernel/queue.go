package kernel

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/netpol/netpol/pkg/nft"
)

// DetectQueue finds which queue statement the kernel of a network
// namespace (fd; < 0: the current one) takes: the native one first, then
// the xtables target, each tried in a probe table of its own that is
// deleted again. Modules load on first use, as with any rule.
func DetectQueue(netnsFd int) (nft.QueueKind, error) {
	var errs []error
	for _, k := range []nft.QueueKind{nft.QueueNative, nft.QueueXtables} {
		err := probeQueue(netnsFd, k)
		if err == nil {
			return k, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", k, err))
	}
	return nft.QueueUnavailable, errors.Join(errs...)
}

func probeQueue(netnsFd int, k nft.QueueKind) error {
	conn, err := newConnBuf(netnsFd, false, 1<<16)
	if err != nil {
		return err
	}
	exprs, err := nft.QueueExprs(k, 0)
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: "netpol-queue-probe-" + strconv.Itoa(os.Getpid()), Family: nftables.TableFamilyINet}
	conn.AddTable(t)
	ch := conn.AddChain(&nftables.Chain{Name: "probe", Table: t})
	conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
	err = conn.Flush()
	conn.DelTable(t)
	if derr := conn.Flush(); err == nil && derr != nil {
		return fmt.Errorf("deleting the probe table: %w", derr)
	}
	return err
}

// RuleCounters sums the packets the counters of a chain's rules counted,
// in the inet table of the network namespace netnsFd (< 0: the current
// one).
func RuleCounters(netnsFd int, table, chain string) (uint64, error) {
	conn, err := newConnBuf(netnsFd, false, 1<<16)
	if err != nil {
		return 0, err
	}
	rules, err := conn.GetRules(&nftables.Table{Name: table, Family: nftables.TableFamilyINet}, &nftables.Chain{Name: chain})
	if err != nil {
		return 0, fmt.Errorf("chain %s: %w", chain, err)
	}
	var packets uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				packets += c.Packets
			}
		}
	}
	return packets, nil
}

// Counters reads the named counter objects of the inet table in the
// network namespace netnsFd (< 0: the current one), by name.
func Counters(netnsFd int, table string) (map[string]nft.CounterValue, error) {
	conn, err := newConnBuf(netnsFd, false, 1<<20)
	if err != nil {
		return nil, err
	}
	objs, err := conn.GetNamedObjects(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
	if err != nil {
		return nil, fmt.Errorf("counters of table %s: %w", table, err)
	}
	out := make(map[string]nft.CounterValue, len(objs))
	for _, o := range objs {
		no, ok := o.(*nftables.NamedObj)
		if !ok || no.Type != nftables.ObjTypeCounter {
			continue
		}
		if c, ok := no.Obj.(*expr.Counter); ok {
			out[no.Name] = nft.CounterValue{Packets: c.Packets, Bytes: c.Bytes}
		}
	}
	return out, nil
}
