package lab

import "github.com/netpol/netpol/pkg/probe"

// Results of a probe, as Observation.Result: those of the probe protocol,
// plus the lab's own.
const (
	ResultOK          = probe.ResultOK
	ResultTimeout     = probe.ResultTimeout
	ResultRefused     = probe.ResultRefused
	ResultUnreachable = probe.ResultUnreachable
	ResultRejected    = probe.ResultRejected
	// ResultNoAddress: the source has no address of the destination's
	// family (the evaluator says not allowed).
	ResultNoAddress = "no-address"
	// ResultNotInLab: the evaluator lists the pod but the lab could not
	// build it (see Lab.Notes).
	ResultNotInLab = "not-in-lab"
)

// resultErrorPrefix starts the Result of a probe the lab failed to make
// (no socket, ...): a lab problem, never a policy answer.
const resultErrorPrefix = probe.ErrorPrefix

// SCTPSupported reports, once per process, whether the kernel can make SCTP
// sockets, with a reason fit for an error message. Without them the lab
// serves no SCTP ports and refuses SCTP probes.
func SCTPSupported() (bool, string) { return probe.SCTPSupported() }
