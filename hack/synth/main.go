// Command synth writes a synthetic cluster (internal/synth) as YAML to
// stdout, for the scale harnesses.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/netpol/netpol/internal/synth"
)

func main() {
	var s synth.Spec
	flag.StringVar(&s.Shape, "shape", synth.ShapeEasy, "cluster shape: easy (the benchmarks') or realistic (policies as platform teams write them)")
	flag.IntVar(&s.Namespaces, "namespaces", 50, "namespaces")
	flag.IntVar(&s.Pods, "pods", 1000, "pods")
	flag.IntVar(&s.Nodes, "nodes", 10, "nodes")
	flag.IntVar(&s.NetworkPolicies, "network-policies", 500, "NetworkPolicies")
	flag.IntVar(&s.AdminPolicies, "admin-policies", 50, "Admin and Baseline policies")
	flag.IntVar(&s.Services, "services", 0, "Services, each with an EndpointSlice of its pods")
	flag.Uint64Var(&s.Seed, "seed", 1, "random seed")
	flag.Parse()
	if err := synth.CheckShape(s.Shape); err != nil {
		fmt.Fprintln(os.Stderr, "synth:", err)
		os.Exit(2)
	}
	fmt.Print(synth.YAML(s))
}
