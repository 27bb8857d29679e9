package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// FieldManager is the server-side apply field manager of ApplyFiles,
// ApplyYAML and InstallCRDs.
const FieldManager = "netpol-e2e"

var gvrCRD = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Document is one object read from a manifest file.
type Document struct {
	Source string // "path#N": the file and the number of the document in it, from 1
	Object *unstructured.Unstructured
}

// Name describes the object for error messages: "Kind namespace/name".
func (d Document) Name() string {
	n := d.Object.GetName()
	if ns := d.Object.GetNamespace(); ns != "" {
		n = ns + "/" + n
	}
	return d.Object.GetKind() + " " + n
}

// ReadFiles decodes multi-document YAML or JSON files (a directory stands
// for its *.yaml, *.yml and *.json files, sorted; `kind: List` is
// expanded); empty documents are skipped.
func ReadFiles(paths ...string) ([]Document, error) {
	var docs []Document
	for _, path := range paths {
		files := []string{path}
		if st, err := os.Stat(path); err != nil {
			return nil, err
		} else if st.IsDir() {
			files = nil
			entries, err := os.ReadDir(path)
			if err != nil {
				return nil, err
			}
			for _, ent := range entries {
				ext := filepath.Ext(ent.Name())
				if !ent.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
					files = append(files, filepath.Join(path, ent.Name()))
				}
			}
			slices.Sort(files)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				return nil, err
			}
			d, err := decode(file, data)
			if err != nil {
				return nil, err
			}
			docs = append(docs, d...)
		}
	}
	return docs, nil
}

func decode(source string, data []byte) ([]Document, error) {
	var docs []Document
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for n := 1; ; n++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s#%d: %w", source, n, err)
		}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s#%d: %w", source, n, err)
		}
		js = bytes.TrimSpace(js)
		if len(js) == 0 || string(js) == "null" || string(js) == "{}" {
			continue
		}
		src := fmt.Sprintf("%s#%d", source, n)
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		if obj.IsList() {
			err := obj.EachListItem(func(o runtime.Object) error {
				docs = append(docs, Document{Source: src, Object: o.(*unstructured.Unstructured)})
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", src, err)
			}
			continue
		}
		docs = append(docs, Document{Source: src, Object: obj})
	}
}

// KustomizationResources returns the resources listed in
// dir/kustomization.yaml, as paths joined to dir, in their order. Only
// plain file entries are supported (no bases, patches or generators).
func KustomizationResources(dir string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "kustomization.yaml"), err)
	}
	paths := make([]string, len(k.Resources))
	for i, r := range k.Resources {
		paths[i] = filepath.Join(dir, r)
	}
	return paths, nil
}

// ApplyFiles server-side applies every object in the files (see
// ReadFiles), in order, with field manager "netpol-e2e" and force; with
// dryRun the apiserver validates and admits them without storing them
// (DryRun: All). Namespaced objects without a namespace go to "default".
// The error names the file, document and object.
func (e *Env) ApplyFiles(ctx context.Context, dryRun bool, paths ...string) error {
	docs, err := ReadFiles(paths...)
	if err != nil {
		return err
	}
	return e.Apply(ctx, dryRun, docs...)
}

// DecodeYAML decodes multi-document YAML or JSON as ReadFiles does a file;
// source names it in errors and Document.Source.
func DecodeYAML(source, manifests string) ([]Document, error) {
	return decode(source, []byte(manifests))
}

// ApplyYAML is ApplyFiles for manifests in memory.
func (e *Env) ApplyYAML(ctx context.Context, dryRun bool, manifests string) error {
	docs, err := decode("yaml", []byte(manifests))
	if err != nil {
		return err
	}
	return e.Apply(ctx, dryRun, docs...)
}

// Apply server-side applies the documents in order (see ApplyFiles).
func (e *Env) Apply(ctx context.Context, dryRun bool, docs ...Document) error {
	opts := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, d := range docs {
		if err := e.apply(ctx, d, opts); err != nil {
			return err
		}
	}
	return nil
}

func (e *Env) apply(ctx context.Context, d Document, opts metav1.ApplyOptions) error {
	obj := d.Object.DeepCopy()
	gvk := obj.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return fmt.Errorf("%s: %s: apiVersion and kind are required", d.Source, d.Name())
	}
	mapping, err := e.restMapper().mapping(gvk)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", d.Source, d.Name(), err)
	}
	ri := e.Dynamic.Resource(mapping.Resource)
	var res interface {
		Apply(context.Context, string, *unstructured.Unstructured, metav1.ApplyOptions, ...string) (*unstructured.Unstructured, error)
	} = ri
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(metav1.NamespaceDefault)
		}
		res = ri.Namespace(obj.GetNamespace())
	} else {
		obj.SetNamespace("")
	}
	if _, err := res.Apply(ctx, obj.GetName(), obj, opts); err != nil {
		return fmt.Errorf("%s: applying %s %s: %w", d.Source, obj.GetAPIVersion(), d.Name(), err)
	}
	return nil
}

// InstallCRDs server-side applies the CustomResourceDefinitions in the
// files (see ReadFiles; any other kind is an error) and waits until each
// is Established and every served version answers a list.
func (e *Env) InstallCRDs(ctx context.Context, paths ...string) error {
	docs, err := ReadFiles(paths...)
	if err != nil {
		return err
	}
	for _, d := range docs {
		if d.Object.GroupVersionKind().GroupKind() != (schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}) {
			return fmt.Errorf("%s: %s is not a CustomResourceDefinition", d.Source, d.Name())
		}
	}
	if err := e.Apply(ctx, false, docs...); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	for _, d := range docs {
		if err := e.waitCRD(ctx, d); err != nil {
			return err
		}
	}
	e.restMapper().reset()
	return nil
}

func (e *Env) waitCRD(ctx context.Context, d Document) error {
	name := d.Object.GetName()
	last := errors.New("not Established yet")
	for {
		crd, err := e.Dynamic.Resource(gvrCRD).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = crdReady(ctx, e, crd)
			if last == nil {
				return nil
			}
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: CustomResourceDefinition %s: %w (%v)", d.Source, name, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// crdReady: Established and NamesAccepted, and a list of each served
// version answers (the handler can lag the condition briefly).
func crdReady(ctx context.Context, e *Env, crd *unstructured.Unstructured) error {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	status := map[string]string{}
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok {
			t, _ := m["type"].(string)
			s, _ := m["status"].(string)
			status[t] = s
		}
	}
	for _, t := range []string{"NamesAccepted", "Established"} {
		if status[t] != "True" {
			return fmt.Errorf("condition %s is %q", t, status[t])
		}
	}
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		m, _ := v.(map[string]any)
		if served, _ := m["served"].(bool); !served {
			continue
		}
		version, _ := m["name"].(string)
		gvr := schema.GroupVersionResource{Group: group, Version: version, Resource: plural}
		if _, err := e.Dynamic.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return fmt.Errorf("listing %s: %w", gvr, err)
		}
	}
	return nil
}

// restMapper maps kinds to resources through discovery, re-discovering
// once when a kind is unknown (a CRD applied since).
type restMapper struct {
	m *restmapper.DeferredDiscoveryRESTMapper
}

func (e *Env) restMapper() *restMapper {
	e.mapperMu.Lock()
	defer e.mapperMu.Unlock()
	if e.mapper == nil {
		e.mapper = &restMapper{m: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(e.Client.Discovery()))}
	}
	return e.mapper
}

func (r *restMapper) reset() { r.m.Reset() }

func (r *restMapper) mapping(gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	m, err := r.m.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		r.m.Reset()
		m, err = r.m.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		if meta.IsNoMatchError(err) {
			return nil, fmt.Errorf("the server does not serve %s (is its CRD installed?)", gvk)
		}
		return nil, err
	}
	return m, nil
}
