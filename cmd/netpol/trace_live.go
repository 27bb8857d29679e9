package main

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/netpol/netpol/pkg/eval"
)

type liveTraceOptions struct {
	enabled  bool
	duration time.Duration
	netns    string
}

// liveTrace arms the kernel's nftrace for the tuple and prints what the
// kernel reports (being built).
func liveTrace(ctx context.Context, out io.Writer, src, dst string, probe eval.Probe, format string, opts liveTraceOptions) error {
	return errors.New("trace --live is not available yet")
}
