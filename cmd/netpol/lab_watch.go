package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/pkg/lab"
)

// labWatchQuiet is how long the files must stay unchanged after an edit
// before the lab re-syncs: an editor's save is several events.
const labWatchQuiet = 300 * time.Millisecond

// watchLabFiles re-reads in's files whenever they change and re-syncs the
// running lab from them, until ctx is done. A state that does not load
// cleanly (a YAML error, an object netpol rejects) is not synced: the lab
// keeps enforcing the last good one, and says so.
func watchLabFiles(ctx context.Context, in *inputFlags, lb *lab.Lab, enf *conformance.Enforcer, status lab.Status, out, stderr io.Writer) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("--watch: %w", err)
	}
	defer w.Close()
	watched, err := watchPaths(w, in.files)
	if err != nil {
		return fmt.Errorf("--watch: %w", err)
	}
	fmt.Fprintf(out, "lab %s: watching %s; each change is synced to the nodes\n", lb.Prefix(), strings.Join(in.files, ", "))
	var quiet <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-w.Errors:
			fmt.Fprintf(stderr, "lab %s: watching the files: %v\n", lb.Prefix(), err)
		case ev := <-w.Events:
			if !watched(ev.Name) {
				continue
			}
			if ev.Has(fsnotify.Create) {
				if info, err := os.Stat(ev.Name); err == nil && info.IsDir() {
					w.Add(ev.Name) // a new directory under a watched one
				}
			}
			quiet = time.After(labWatchQuiet)
		case <-quiet:
			quiet = nil
			if err := resyncLab(ctx, in, lb, enf, &status, out, stderr); err != nil {
				fmt.Fprintf(stderr, "lab %s: not re-synced, the nodes keep enforcing the last state synced: %v\n", lb.Prefix(), err)
			}
		}
	}
}

// watchPaths watches each path (a directory and the directories under
// it, or a file's directory) and returns which changed names concern
// them.
func watchPaths(w *fsnotify.Watcher, paths []string) (func(string) bool, error) {
	var dirs, files []string
	for _, p := range paths {
		if p == "-" {
			return nil, errors.New("standard input (-f -) cannot be watched")
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, err
		}
		info, err := os.Stat(abs)
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			// The directory, not the file: editors replace a file by
			// renaming another onto it.
			files = append(files, abs)
			if err := w.Add(filepath.Dir(abs)); err != nil {
				return nil, err
			}
			continue
		}
		dirs = append(dirs, abs)
		err = filepath.WalkDir(abs, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			return w.Add(path)
		})
		if err != nil {
			return nil, err
		}
	}
	return func(name string) bool {
		if slices.Contains(files, name) {
			return true
		}
		return slices.ContainsFunc(dirs, func(d string) bool { return name == d || strings.HasPrefix(name, d+string(filepath.Separator)) })
	}, nil
}

// resyncLab loads in's files and, when they load without an error,
// brings the lab's pods in line (lab.Update) and programs every node from
// them as the agent does (a difference applied, strict mode ending the
// flows the change denies), then rewrites the lab's status.
func resyncLab(ctx context.Context, in *inputFlags, lb *lab.Lab, enf *conformance.Enforcer, status *lab.Status, out, stderr io.Writer) error {
	l, err := in.load(ctx, nil, stderr)
	if err != nil {
		return err
	}
	if l.problems > 0 {
		return fmt.Errorf("%d error(s) in the files (above)", l.problems)
	}
	if err := lb.Update(ctx, l.snap); err != nil {
		return err
	}
	rep, err := enf.Sync(l.snap)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "lab %s: synced (%v)\n", lb.Prefix(), rep.Duration.Round(time.Millisecond))
	names := make([]string, 0, len(rep.Nodes))
	for name := range rep.Nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		n := rep.Nodes[name]
		st, px := n.Stats, n.ProxyStats
		fmt.Fprintf(out, "  node %s: policy %d message(s) (%d chain(s) added, %d rewritten, %d deleted; %d element(s) added, %d deleted), services %d message(s)\n",
			name, st.Messages, st.ChainsAdded, st.ChainsRewritten, st.ChainsDeleted, st.ElementsAdded, st.ElementsDeleted, px.Messages)
		for _, fl := range n.Ended {
			fmt.Fprintf(out, "    strict mode ended %s\n", fl)
		}
	}
	fresh := lb.Status()
	fresh.PID, fresh.Files, fresh.Synced = status.PID, status.Files, time.Now().UTC()
	*status = fresh
	return lab.WriteStatus(fresh)
}
