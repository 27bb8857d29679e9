package dataplane_test

import (
	"testing"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// The scale of `netpol table`'s target: 1,000 pods in 50 namespaces on 10
// nodes, 500 NetworkPolicies and 50 Admin/Baseline policies, 2 ports.
var scale = synth.Spec{Namespaces: 50, Pods: 1000, Nodes: 10, NetworkPolicies: 500, AdminPolicies: 50, Seed: 1}

var probes = []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}}

// BenchmarkTableNft is `netpol table --engine nft` minus I/O: model,
// evaluator index, every node's policy and NAT tables compiled, and every
// cell traced through them. It also checks the traced table against the
// evaluator's, outside the timer.
func BenchmarkTableNft(b *testing.B) {
	snap, err := synth.Snapshot(scale)
	if err != nil {
		b.Fatal(err)
	}
	var got *eval.TruthTable
	var ev *eval.Evaluator
	for b.Loop() {
		ev = eval.New(snap, policy.Build(snap))
		dp, err := dataplane.New(snap, ev, false)
		if err != nil {
			b.Fatal(err)
		}
		if got, err = dp.TruthTable(eval.TruthTableOptions{Probes: probes}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	want := ev.TruthTable(eval.TruthTableOptions{Probes: probes})
	allowed := 0
	for i, w := range want.Results {
		if got.Results[i] != w {
			b.Fatalf("%s -> %s %s/%d: traced %v, evaluator %v", w.From, w.To, w.Protocol, w.Port, got.Results[i].Allowed, w.Allowed)
		}
		if w.Allowed {
			allowed++
		}
	}
	b.ReportMetric(float64(len(want.Results)), "cells")
	b.ReportMetric(float64(allowed)/float64(len(want.Results)), "allowed-fraction")
}

// BenchmarkTableEval is the evaluator's table of the same cluster, in the
// same run: the baseline of the ratio.
func BenchmarkTableEval(b *testing.B) {
	snap, err := synth.Snapshot(scale)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		eval.New(snap, policy.Build(snap)).TruthTable(eval.TruthTableOptions{Probes: probes})
	}
}
