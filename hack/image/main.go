// Command image writes a container image as a docker-archive tarball (what
// `docker save` writes, and what `docker load`, `ctr images import`,
// `kind load image-archive` and `podman load` read) without Docker or a
// registry: one layer holding the given files, a config JSON and
// manifest.json. The output is reproducible: the same files give the same
// image ID.
//
//	go run ./hack/image -o netpol.tar -tag netpol.local/netpol:dev \
//	    -entrypoint /bin/netpol -file bin/netpol=_output/image/netpol
//
// -cmd gives the default arguments (the image's Cmd), as upstream's
// agnhost image has `pause`; -link IMAGE_PATH=TARGET adds a symbolic link
// (busybox's applets).
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

type fileList []string

func (f *fileList) String() string     { return strings.Join(*f, ",") }
func (f *fileList) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	var (
		out        = flag.String("o", "", "output tarball")
		tag        = flag.String("tag", "", "image name:tag (repeatable with commas)")
		entrypoint = flag.String("entrypoint", "", "the entrypoint, space-separated")
		cmd        = flag.String("cmd", "", "the default arguments (Cmd), space-separated")
		dirs       = flag.String("dirs", "tmp", "empty directories in the image, comma-separated")
		files      fileList
		links      fileList
	)
	flag.Var(&files, "file", "IMAGE_PATH=HOST_PATH, repeatable; the file keeps its mode")
	flag.Var(&links, "link", "IMAGE_PATH=TARGET, repeatable: a symbolic link")
	flag.Parse()
	if *out == "" || *tag == "" || len(files) == 0 {
		fmt.Fprintln(os.Stderr, "usage: image -o OUT.tar -tag NAME:TAG [-entrypoint CMD] -file IMAGE_PATH=HOST_PATH...")
		os.Exit(2)
	}
	if err := run(*out, strings.Split(*tag, ","), strings.Fields(*entrypoint), strings.Fields(*cmd), strings.Split(*dirs, ","), files, links); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// epoch is every entry's modification time, for reproducible layers.
var epoch = time.Unix(0, 0).UTC()

func run(out string, tags, entrypoint, cmd, dirs, files, links []string) error {
	layer, err := buildLayer(dirs, files, links)
	if err != nil {
		return err
	}
	diffID := digest(layer)
	imageConfig := map[string]any{
		"Entrypoint": entrypoint,
		"Env":        []string{"PATH=/bin:/usr/bin:/usr/local/bin"},
		"WorkingDir": "/",
	}
	if len(cmd) > 0 {
		imageConfig["Cmd"] = cmd
	}
	config := map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config":       imageConfig,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
		"history": []map[string]any{{
			"created":    epoch.Format(time.RFC3339),
			"created_by": "hack/image " + strings.Join(files, " "),
		}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return err
	}
	configID := digest(configJSON)
	manifest := []map[string]any{{
		"Config":   configID + ".json",
		"RepoTags": tags,
		"Layers":   []string{diffID + "/layer.tar"},
	}}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	repos := map[string]map[string]string{}
	for _, t := range tags {
		i := strings.LastIndex(t, ":")
		if i < 0 || strings.Contains(t[i:], "/") {
			return fmt.Errorf("tag %q: want NAME:TAG", t)
		}
		if repos[t[:i]] == nil {
			repos[t[:i]] = map[string]string{}
		}
		repos[t[:i]][t[i+1:]] = diffID
	}
	reposJSON, err := json.Marshal(repos)
	if err != nil {
		return err
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := addDir(tw, diffID+"/"); err != nil {
		return err
	}
	for _, e := range []struct {
		name string
		data []byte
	}{
		{diffID + "/layer.tar", layer},
		{diffID + "/VERSION", []byte("1.0")},
		{configID + ".json", configJSON},
		{"manifest.json", manifestJSON},
		{"repositories", reposJSON},
	} {
		if err := addFile(tw, e.name, 0o644, e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	fmt.Printf("%s: %s sha256:%s (%d bytes)\n", out, strings.Join(tags, ","), configID, buf.Len())
	return nil
}

func buildLayer(dirs, files, links []string) ([]byte, error) {
	type entry struct {
		name string
		host string
		link bool // host is the link's target
	}
	var entries []entry
	parents := map[string]bool{}
	for _, d := range dirs {
		if d = strings.Trim(d, "/"); d != "" {
			parents[d] = true
		}
	}
	for _, f := range files {
		img, host, ok := strings.Cut(f, "=")
		img = strings.Trim(img, "/")
		if !ok || img == "" || host == "" {
			return nil, fmt.Errorf("-file %q: want IMAGE_PATH=HOST_PATH", f)
		}
		entries = append(entries, entry{name: img, host: host})
	}
	for _, l := range links {
		img, target, ok := strings.Cut(l, "=")
		img = strings.Trim(img, "/")
		if !ok || img == "" || target == "" {
			return nil, fmt.Errorf("-link %q: want IMAGE_PATH=TARGET", l)
		}
		entries = append(entries, entry{name: img, host: target, link: true})
	}
	for _, e := range entries {
		for d := path.Dir(e.name); d != "."; d = path.Dir(d) {
			parents[d] = true
		}
	}
	var dirList []string
	for d := range parents {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirList {
		if err := addDir(tw, d+"/"); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		if e.link {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: e.name, Linkname: e.host, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
			continue
		}
		data, err := os.ReadFile(e.host)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(e.host)
		if err != nil {
			return nil, err
		}
		if err := addFile(tw, e.name, int64(st.Mode().Perm()), data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func addDir(tw *tar.Writer, name string) error {
	mode := int64(0o755)
	if name == "tmp/" {
		mode = 0o1777
	}
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: epoch, Format: tar.FormatPAX})
}

func addFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
