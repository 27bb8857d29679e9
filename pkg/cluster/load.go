package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsjson "sigs.k8s.io/json"
	anpv1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Report collects what loading found wrong or left out. Problems with one
// object never stop the others from loading.
type Report struct {
	// Errors name the file, document, object and field. An object with an
	// error is not loaded (except as noted in the error).
	Errors []error
	// Skipped counts documents of kinds the snapshot does not hold, by
	// "apiVersion kind".
	Skipped map[string]int
	// Notes are things worth a line on stderr that are not errors, such as
	// unknown fields in objects other than policies.
	Notes []string
	// Objects counts the documents read that were not empty (objects of
	// any kind, valid or not; a List counts its items).
	Objects int
	// Empty names each path that held no object, with why ("empty",
	// "no .yaml, .yml or .json file").
	Empty []string
}

func newReport() *Report {
	return &Report{Skipped: map[string]int{}}
}

// Merge appends other's findings to r.
func (r *Report) Merge(other *Report) {
	r.Errors = append(r.Errors, other.Errors...)
	for k, v := range other.Skipped {
		r.Skipped[k] += v
	}
	r.Notes = append(r.Notes, other.Notes...)
	r.Objects += other.Objects
	r.Empty = append(r.Empty, other.Empty...)
}

// SkippedNote is the one-line note about skipped kinds, or "".
func (r *Report) SkippedNote() string {
	if len(r.Skipped) == 0 {
		return ""
	}
	kinds := make([]string, 0, len(r.Skipped))
	total := 0
	for k, n := range r.Skipped {
		kinds = append(kinds, fmt.Sprintf("%s (%d)", k, n))
		total += n
	}
	sort.Strings(kinds)
	return fmt.Sprintf("skipped %d object(s) of kinds netpol does not use: %s", total, strings.Join(kinds, ", "))
}

// LoadPaths reads every path (a file, a directory of .yaml/.yml/.json files,
// or "-" for stdin) into one snapshot. Duplicate objects are errors: the
// first one read is kept. Report.Empty names the paths that held no object.
// Files and stdin are read as streams (see AddReader).
func LoadPaths(paths []string, stdin io.Reader) (*Snapshot, *Report) {
	snap := New()
	return snap, snap.AddPaths(paths, stdin, false)
}

// AddPaths reads paths into the snapshot as LoadPaths does; with replace,
// an object that is already there is replaced (as `kubectl apply` would).
func (s *Snapshot) AddPaths(paths []string, stdin io.Reader, replace bool) *Report {
	report := newReport()
	for _, p := range paths {
		before := report.Objects
		if p == "-" {
			s.addStream(stdin, "<stdin>", replace, report, func(err error) error { return fmt.Errorf("reading stdin: %w", err) })
			if report.Objects == before {
				report.Empty = append(report.Empty, "- (stdin): no object")
			}
			continue
		}
		files, err := expandPath(p)
		if err != nil {
			report.Errors = append(report.Errors, err)
			continue
		}
		if len(files) == 0 {
			report.Empty = append(report.Empty, p+": a directory without .yaml, .yml or .json files")
			continue
		}
		errs := len(report.Errors)
		for _, f := range files {
			r, err := os.Open(f)
			if err != nil {
				report.Errors = append(report.Errors, err)
				continue
			}
			s.addStream(r, f, replace, report, func(err error) error { return err })
			r.Close()
		}
		if report.Objects == before && len(report.Errors) == errs {
			what := "no object (an empty file, or only comments and empty documents)"
			if len(files) > 1 || files[0] != p {
				what = fmt.Sprintf("no object in its %d .yaml/.yml/.json file(s)", len(files))
			}
			report.Empty = append(report.Empty, p+": "+what)
		}
	}
	return report
}

func expandPath(p string) ([]string, error) {
	info, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []string{p}, nil
	}
	var files []string
	err = filepath.WalkDir(p, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yaml", ".yml", ".json":
			if !d.IsDir() {
				files = append(files, path)
			}
		}
		return nil
	})
	sort.Strings(files)
	return files, err
}

// AddDocuments decodes a stream of YAML or JSON documents (multi-document,
// `kind: List` included) into the snapshot. With replace, an object that is
// already there is replaced (as `kubectl apply` would); without, it is an
// error and the first one stays.
func (s *Snapshot) AddDocuments(data []byte, file string, replace bool) *Report {
	return s.AddReader(bytes.NewReader(data), file, replace)
}

// AddReader is AddDocuments reading r as a stream: documents are decoded
// as they are read (on every CPU, added in order), the items of a `kind:
// List` one at a time, so that no more of the input is held than the
// objects kept.
func (s *Snapshot) AddReader(r io.Reader, file string, replace bool) *Report {
	report := newReport()
	s.addStream(r, file, replace, report, func(err error) error { return fmt.Errorf("reading %s: %w", file, err) })
	return report
}

var listKind = regexp.MustCompile(`List$`)

// errNotChecked marks a result that quickHead read from what is not JSON:
// never reported (the unit is decoded again, through the YAML parser).
var errNotChecked = errors.New("not JSON")

// addObject adds one JSON document (an object or a List of them).
func (s *Snapshot) addObject(data []byte, src Source, replace bool, report *Report) {
	res, _ := analyze(data, src, "", 0, decodeChecked, nil)
	for i := range res {
		s.commit(&res[i], replace, report)
	}
}

// result is what one document or List item comes to, found without the
// snapshot (decoding can run on another goroutine); commit adds it.
type result struct {
	counted bool   // counts in Report.Objects
	err     error  // reported instead of adding anything
	skipped string // "apiVersion kind" of a kind netpol does not read
	// The decoded object: add puts it in the snapshot.
	key       ObjectKey
	src       Source
	item      string // the List item it is, "" for none
	add       func(*Snapshot)
	decodeErr error // reported after the duplicate check
	unknown   []string
}

// clean is a result that the decoding of a file's JSON as it is (without
// the YAML parser) decides as the YAML parser would have: nothing to
// report (and so no error message to match).
func (r *result) clean() bool {
	return r.err == nil && r.decodeErr == nil && len(r.unknown) == 0
}

// where says where an object is: the source, and the item of its List.
func where(src Source, item string) string {
	if item == "" {
		return src.String()
	}
	if src.File == "" {
		return fmt.Sprintf("%s (item %s)", src, item)
	}
	return fmt.Sprintf("%s (document %d, item %s)", src.File, src.Document, item)
}

// How analyze may read its JSON.
const (
	decodeChecked = iota // all through the decoder, which checks it all
	decodeUnique         // with quickHead (no key is there twice)
	decodeValid          // with quickHead, and valid JSON
)

// analyze decodes one JSON document: an object, or a List of them (each
// item in turn; item names the item this document is, "" for none, and
// base numbers the items of a List that are not its first). It appends a
// result per object and reports whether the document was a List.
func analyze(data []byte, src Source, item string, base int, mode int, out []result) ([]result, bool) {
	at := func() string { return where(src, item) }
	data = bytes.TrimSpace(data)
	if len(data) == 0 || string(data) == "null" {
		return out, false // an empty document, as between two "---"
	}
	if data[0] != '{' {
		return append(out, result{counted: true, err: fmt.Errorf("%s: not a Kubernetes object: the document is %s, not a mapping with apiVersion and kind", at(), documentKind(data))}), false
	}
	var head struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	quick := false
	if mode != decodeChecked {
		head.APIVersion, head.Kind, head.Metadata.Name, head.Metadata.Namespace, quick = quickHead(data)
	}
	// Case-sensitive, as the typed decode below: "metAdata" is not metadata.
	if !quick {
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &head); err != nil {
			return append(out, result{counted: true, err: fmt.Errorf("%s: not a Kubernetes object: %s", at(), plainJSONError(err))}), false
		}
	}
	// What the decoder does not read, as a kind that is skipped, must be
	// JSON all the same.
	unchecked := quick && mode == decodeUnique
	if head.Kind == "" || head.APIVersion == "" {
		return append(out, result{counted: true, err: fmt.Errorf("%s: object %q has no apiVersion or kind", at(), head.Metadata.Name)}), false
	}
	if listKind.MatchString(head.Kind) && head.Items != nil {
		for i, it := range head.Items {
			n := strconv.Itoa(base + i + 1)
			if item != "" {
				n = item + "." + n
			}
			out, _ = analyze(it, src, n, 0, mode, out)
		}
		return out, true
	}
	r := result{counted: true}
	skip := func() ([]result, bool) {
		r.skipped = head.APIVersion + " " + head.Kind
		if unchecked && !json.Valid(data) {
			r.err = errNotChecked
		}
		return append(out, r), false
	}
	kind, ok := kinds[head.Kind]
	if !ok {
		return skip()
	}
	gv, err := parseGroupVersion(head.APIVersion)
	if err != nil || gv.group != kind.group {
		return skip()
	}
	decode, ok := kind.versions[gv.version]
	if !ok {
		r.err = fmt.Errorf("%s: %s %q: unsupported apiVersion %q (netpol reads %s)",
			at(), head.Kind, head.Metadata.Name, head.APIVersion, kind.supported())
		return append(out, r), false
	}
	// Strings that many objects repeat are shared (as the objects' own).
	src.APIVersion = unique.Make(head.APIVersion).Value()
	key := ObjectKey{Kind: unique.Make(head.Kind).Value(), Namespace: head.Metadata.Namespace, Name: head.Metadata.Name}
	if key.Name == "" {
		r.err = fmt.Errorf("%s: %s without metadata.name", at(), head.Kind)
		return append(out, r), false
	}
	if errs := validation.IsDNS1123Subdomain(key.Name); len(errs) > 0 {
		r.err = fmt.Errorf("%s: %s: metadata.name %q: %s", at(), head.Kind, key.Name, strings.Join(errs, "; "))
		return append(out, r), false
	}
	if errs := validation.IsDNS1123Label(key.Namespace); kind.namespaced && key.Namespace != "" && len(errs) > 0 {
		r.err = fmt.Errorf("%s: %s %q: metadata.namespace %q: %s", at(), head.Kind, key.Name, key.Namespace, strings.Join(errs, "; "))
		return append(out, r), false
	}
	if !kind.namespaced && key.Namespace != "" {
		key.Namespace = "" // cluster-scoped: a namespace field means nothing
	}
	if kind.namespaced && key.Namespace == "" {
		key.Namespace = metav1.NamespaceDefault // as kubectl does for a manifest without one
	}
	key.Namespace = unique.Make(key.Namespace).Value()
	r.key, r.src, r.item = key, src, item
	var obj metav1.Object
	r.add, obj, r.unknown, r.decodeErr = decode(data, key.Namespace)
	if r.decodeErr != nil {
		r.add, r.unknown = nil, nil
	} else {
		r.key.Name = obj.GetName() // the object's string, not a copy
	}
	return append(out, r), false
}

// commit adds what analyze found to the snapshot and the report, in the
// order the original single pass did: a duplicate is reported before the
// object's decoding errors.
func (s *Snapshot) commit(r *result, replace bool, report *Report) {
	if r.counted {
		report.Objects++
	}
	switch {
	case r.err != nil:
		report.Errors = append(report.Errors, r.err)
		return
	case r.skipped != "":
		report.Skipped[r.skipped]++
		return
	case r.add == nil && r.decodeErr == nil:
		return // an empty document
	}
	key := r.key
	if prev, dup := s.Origin[key]; dup {
		if !replace {
			report.Errors = append(report.Errors, fmt.Errorf("%s: duplicate %s, already read from %s; keeping the first", where(r.src, r.item), key, prev))
			return
		}
		s.Delete(key)
	}
	if r.decodeErr != nil {
		report.Errors = append(report.Errors, fmt.Errorf("%s: %s: %s", where(r.src, r.item), key, plainJSONError(r.decodeErr)))
		return
	}
	if len(r.unknown) > 0 {
		s.UnknownFields[key] = r.unknown
		if !isPolicyKind(key.Kind) {
			report.Notes = append(report.Notes, fmt.Sprintf("%s: %s: ignoring unknown field(s) %s", where(r.src, r.item), key, strings.Join(r.unknown, ", ")))
		}
	}
	r.add(s)
	s.Origin[key] = r.src
}

// documentKind says what a JSON document that is not an object is.
func documentKind(data []byte) string {
	switch data[0] {
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// plainJSONError says what a decoding error means without Go type names:
// "metadata.name is a number, not a string", "spec.ports.port is 8.5, not
// a whole number".
func plainJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := strings.TrimPrefix(te.Field, "TypeMeta.") // the inline apiVersion and kind
		if field == "" {
			field = "the document"
		}
		// A number of the wrong shape or size comes as "number 8.5".
		if n, ok := strings.CutPrefix(te.Value, "number "); ok && isInteger(te.Type.Kind()) {
			if strings.ContainsAny(n, ".eE") {
				return fmt.Sprintf("%s is %s, not a whole number", field, n)
			}
			return fmt.Sprintf("%s is %s, out of range for a %d-bit whole number", field, n, te.Type.Bits())
		}
		want := te.Type.Kind().String()
		switch want {
		case "struct", "map":
			want = "a mapping"
		case "slice", "array":
			want = "a list"
		case "string":
			want = "a string"
		case "bool":
			want = "a boolean"
		default:
			want = "a number"
		}
		return fmt.Sprintf("%s is %s, not %s", field, jsonValueName(te.Value), want)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d: %s", se.Offset, se.Error())
	}
	return err.Error()
}

func isInteger(k reflect.Kind) bool {
	return k >= reflect.Int && k <= reflect.Uintptr
}

func jsonValueName(v string) string {
	switch v {
	case "object":
		return "a mapping"
	case "array":
		return "a list"
	case "string", "number", "bool":
		if v == "bool" {
			return "a boolean"
		}
		return "a " + v
	}
	return v
}

type groupVersion struct{ group, version string }

func parseGroupVersion(apiVersion string) (groupVersion, error) {
	parts := strings.Split(apiVersion, "/")
	switch len(parts) {
	case 1:
		return groupVersion{version: parts[0]}, nil
	case 2:
		return groupVersion{group: parts[0], version: parts[1]}, nil
	}
	return groupVersion{}, fmt.Errorf("malformed apiVersion %q", apiVersion)
}

// decodeFunc decodes one object, without the snapshot: add puts it there.
// It returns the paths of fields the typed struct does not know.
type decodeFunc func(data []byte, namespace string) (add func(*Snapshot), obj metav1.Object, unknown []string, err error)

type kindInfo struct {
	group      string
	namespaced bool
	versions   map[string]decodeFunc
}

func (k kindInfo) supported() string {
	var vs []string
	for v := range k.versions {
		if k.group == "" {
			vs = append(vs, v)
		} else {
			vs = append(vs, k.group+"/"+v)
		}
	}
	sort.Strings(vs)
	return strings.Join(vs, ", ")
}

var kinds = map[string]kindInfo{
	KindNamespace: {group: "", versions: map[string]decodeFunc{"v1": decodeInto(func(s *Snapshot, o *corev1.Namespace) {
		s.Namespaces = append(s.Namespaces, o)
	})}},
	KindNode: {group: "", versions: map[string]decodeFunc{"v1": decodeInto(func(s *Snapshot, o *corev1.Node) {
		s.Nodes = append(s.Nodes, o)
	})}},
	KindPod: {group: "", namespaced: true, versions: map[string]decodeFunc{"v1": decodeInto(func(s *Snapshot, o *corev1.Pod) {
		s.Pods = append(s.Pods, o)
	})}},
	KindService: {group: "", namespaced: true, versions: map[string]decodeFunc{"v1": decodeInto(func(s *Snapshot, o *corev1.Service) {
		s.Services = append(s.Services, o)
	})}},
	KindEndpointSlice: {group: "discovery.k8s.io", namespaced: true, versions: map[string]decodeFunc{"v1": decodeInto(func(s *Snapshot, o *discoveryv1.EndpointSlice) {
		s.EndpointSlices = append(s.EndpointSlices, o)
	})}},
	KindNetworkPolicy: {group: "networking.k8s.io", namespaced: true, versions: map[string]decodeFunc{"v1": decodeInto(func(s *Snapshot, o *networkingv1.NetworkPolicy) {
		s.NetworkPolicies = append(s.NetworkPolicies, o)
	})}},
	KindAdminPolicy: {group: "policy.networking.k8s.io", versions: map[string]decodeFunc{"v1alpha1": decodeInto(func(s *Snapshot, o *anpv1alpha1.AdminNetworkPolicy) {
		s.AdminPolicies = append(s.AdminPolicies, o)
	})}},
	KindBaselinePolicy: {group: "policy.networking.k8s.io", versions: map[string]decodeFunc{"v1alpha1": decodeInto(func(s *Snapshot, o *anpv1alpha1.BaselineAdminNetworkPolicy) {
		s.BaselinePolicies = append(s.BaselinePolicies, o)
	})}},
	KindConfigMap: {group: "", namespaced: true, versions: map[string]decodeFunc{"v1": decodeInto(func(s *Snapshot, o *corev1.ConfigMap) {
		s.ConfigMaps = append(s.ConfigMaps, o)
	})}},
	KindServiceCIDR: {group: "networking.k8s.io", versions: map[string]decodeFunc{"v1": decodeInto(func(s *Snapshot, o *networkingv1.ServiceCIDR) {
		s.ServiceCIDRs = append(s.ServiceCIDRs, o)
	})}},
	// v1alpha2 and v1beta1 ClusterNetworkPolicy have the same schema, so
	// both decode into the v1beta1 struct.
	KindClusterPolicy: {group: "policy.networking.k8s.io", versions: map[string]decodeFunc{
		"v1beta1":  decodeInto(addClusterPolicy),
		"v1alpha2": decodeInto(addClusterPolicy),
	}},
}

// SupportedKinds lists what the loader reads, as "KIND apiVersion[, ...]",
// sorted by kind.
func SupportedKinds() []string {
	out := make([]string, 0, len(kinds))
	for k, info := range kinds {
		out = append(out, k+" "+info.supported())
	}
	sort.Strings(out)
	return out
}

func addClusterPolicy(s *Snapshot, o *cnpv1beta1.ClusterNetworkPolicy) {
	s.ClusterPolicies = append(s.ClusterPolicies, o)
}

// namespacedObject is what decodeInto needs of a typed object.
type namespacedObject interface {
	GetNamespace() string
	SetNamespace(string)
}

func decodeInto[T any, PT interface {
	*T
	namespacedObject
}](add func(*Snapshot, PT)) decodeFunc {
	return func(data []byte, namespace string) (func(*Snapshot), metav1.Object, []string, error) {
		obj := PT(new(T))
		strict, err := sigsjson.UnmarshalStrict(data, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		if err != nil {
			return nil, nil, nil, err
		}
		var unknown []string
		for _, e := range strict {
			unknown = append(unknown, strings.Trim(strings.TrimPrefix(e.Error(), "unknown field "), `"`))
		}
		obj.SetNamespace(namespace)
		if ns, ok := any(obj).(*corev1.Namespace); ok {
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			ns.Labels[namespaceNameLabel] = ns.Name // the API server sets it on every namespace
		}
		trim(obj)
		m, _ := any(obj).(metav1.Object)
		return func(s *Snapshot) { add(s, obj) }, m, unknown, nil
	}
}

func isPolicyKind(kind string) bool {
	switch kind {
	case KindNetworkPolicy, KindAdminPolicy, KindBaselinePolicy, KindClusterPolicy:
		return true
	}
	return false
}
