// Package testenv runs a real control plane for end-to-end tests: etcd and
// kube-apiserver as child processes on free loopback ports, with temporary
// data, certificates and a kubeconfig. No controllers, scheduler or kubelet
// run: tests create Pods directly and patch their status themselves (the
// lab plays kubelet).
//
// The binaries come from `make e2e-deps`: etcd from Debian's etcd-server
// package (or ETCD_BIN), kube-apiserver built from source into
// _output/tools/<KubeVersion>/kube-apiserver (or KUBE_APISERVER_BIN). See
// docs/e2e.md.
package testenv

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeVersion is the kube-apiserver release the environment runs; it must
// match hack/tools/go.mod (a unit test checks).
const KubeVersion = "v1.37.2"

// ServiceClusterIPRange is the apiserver's --service-cluster-ip-range:
// addresses it allocates to Services (an allocation only: nothing here
// routes or sends traffic to them).
const ServiceClusterIPRange = "10.96.0.0/16"

// Options tune an environment; the zero value is the usual one.
type Options struct {
	// APIServerFlags are appended to kube-apiserver's command line; a flag
	// given here ("--name=value") replaces the default of the same name.
	APIServerFlags []string
	// Users are extra static-token users, next to the admin.
	Users []User
	// StartTimeout bounds the wait for etcd and for kube-apiserver's
	// /readyz, each (default 60s).
	StartTimeout time.Duration
	// EtcdDataDir, when set, holds etcd's data and is kept after Stop: a
	// later run starts on the objects an earlier one wrote (a benchmark
	// that takes minutes to write them).
	EtcdDataDir string
}

// User is a static-token user (kube-apiserver --token-auth-file).
type User struct {
	Name   string
	Token  string
	Groups []string
}

// Env is a running etcd + kube-apiserver pair.
type Env struct {
	// Dir holds everything the environment writes (certificates, token
	// file, kubeconfigs, logs); removed by Stop.
	Dir string
	// Kubeconfig is the path of a kubeconfig file for the admin user
	// (group system:masters), verifying the server with the generated CA.
	Kubeconfig string
	// Config, Client and Dynamic use the admin credentials.
	Config  *rest.Config
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// AdminToken is the admin's bearer token; CAData the CA (PEM) that
	// signed the apiserver's serving certificate.
	AdminToken string
	CAData     []byte
	// EtcdURL is etcd's client URL; EtcdVersion the server's version.
	EtcdURL, EtcdVersion string
	// EtcdLog and APIServerLog are the children's output (each restart of
	// the apiserver appends to the same file).
	EtcdLog, APIServerLog string

	timeout     time.Duration
	etcdDataDir string
	keptEtcdDir string
	apiBin      string
	apiArgs     []string
	readyClient *http.Client

	mu        sync.Mutex
	etcd      *process
	apiserver *process
	stopped   bool

	mapperMu sync.Mutex
	mapper   *restMapper
}

// Start starts an environment for a test, failing it (t.Fatal) when the
// environment cannot start, and stops it in t.Cleanup. When the test has
// failed, the cleanup logs the tail of the apiserver's log first.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := New(ctx, opts)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testenv: last lines of %s:\n%s", e.APIServerLog, tailFile(e.APIServerLog, 30))
		}
		e.Stop()
	})
	return e
}

// New starts etcd and kube-apiserver and waits until the apiserver is
// ready. The caller must call Stop (also when New fails after starting
// children, New stops them itself). ctx bounds the start only: the
// children run until Stop.
func New(ctx context.Context, opts Options) (e *Env, err error) {
	etcdBin, apiBin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	e = &Env{apiBin: apiBin, timeout: opts.StartTimeout, keptEtcdDir: opts.EtcdDataDir}
	if e.timeout <= 0 {
		e.timeout = 60 * time.Second
	}
	removeStaleDirs()
	if e.Dir, err = makeOwnedDir(os.TempDir(), "netpol-testenv-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.Stop()
			e = nil
		}
	}()
	e.EtcdLog = filepath.Join(e.Dir, "etcd.log")
	e.APIServerLog = filepath.Join(e.Dir, "kube-apiserver.log")

	if err := e.startEtcd(ctx, etcdBin); err != nil {
		return e, err
	}

	pki, err := newPKI(e.Dir)
	if err != nil {
		return e, fmt.Errorf("generating certificates: %w", err)
	}
	e.CAData = pki.caPEM
	e.AdminToken = randomToken()
	tokenFile := filepath.Join(e.Dir, "tokens.csv")
	if err := writeTokenFile(tokenFile, append([]User{{Name: "admin", Token: e.AdminToken, Groups: []string{"system:masters"}}}, opts.Users...)); err != nil {
		return e, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pki.caPEM)
	e.readyClient = &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true},
	}

	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return e, err
		}
		e.apiArgs = apiserverArgs(e.Dir, e.EtcdURL, e.EtcdVersion, port, pki, tokenFile, opts.APIServerFlags)
		err = e.StartAPIServer(ctx)
		if err == nil {
			e.Config = &rest.Config{
				Host:            "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
				BearerToken:     e.AdminToken,
				TLSClientConfig: rest.TLSClientConfig{CAData: pki.caPEM},
				QPS:             100,
				Burst:           200,
			}
			break
		}
		e.mu.Lock()
		p := e.apiserver
		e.mu.Unlock()
		if attempt < 3 && p != nil && p.addrInUse() {
			continue
		}
		return e, err
	}

	if e.Client, err = kubernetes.NewForConfig(e.Config); err != nil {
		return e, err
	}
	if e.Dynamic, err = dynamic.NewForConfig(e.Config); err != nil {
		return e, err
	}
	if err := e.waitBootstrap(ctx); err != nil {
		return e, err
	}
	e.Kubeconfig = filepath.Join(e.Dir, "kubeconfig")
	if err := e.WriteKubeconfig(e.Kubeconfig, e.AdminToken); err != nil {
		return e, err
	}
	return e, nil
}

// waitBootstrap waits for what the apiserver creates for itself shortly
// after /readyz (it does not wait for them): the system namespaces and
// priority classes, which tests use right away.
func (e *Env) waitBootstrap(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	for _, ns := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
		err := poll(ctx, func() error {
			_, err := e.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	for _, pc := range []string{"system-node-critical", "system-cluster-critical"} {
		err := poll(ctx, func() error {
			_, err := e.Client.SchedulingV1().PriorityClasses().Get(ctx, pc, metav1.GetOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("priority class %s: %w", pc, err)
		}
	}
	return nil
}

// poll calls f every 50ms until it succeeds or ctx ends.
func poll(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// FindBinaries returns the etcd and kube-apiserver binaries the
// environment would run: ETCD_BIN or etcd on PATH; KUBE_APISERVER_BIN or
// _output/tools/<KubeVersion>/kube-apiserver in the repository.
func FindBinaries() (etcd, apiserver string, err error) {
	const hint = "run `make e2e-deps`"
	etcd = os.Getenv("ETCD_BIN")
	if etcd == "" {
		if etcd, err = exec.LookPath("etcd"); err != nil {
			return "", "", fmt.Errorf("no etcd on PATH and ETCD_BIN is not set: %s (it installs Debian's etcd-server)", hint)
		}
	} else if _, err := os.Stat(etcd); err != nil {
		return "", "", fmt.Errorf("ETCD_BIN: %w", err)
	}

	apiserver = os.Getenv("KUBE_APISERVER_BIN")
	if apiserver != "" {
		if _, err := os.Stat(apiserver); err != nil {
			return "", "", fmt.Errorf("KUBE_APISERVER_BIN: %w", err)
		}
		return etcd, apiserver, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", "", fmt.Errorf("finding kube-apiserver: %w; set KUBE_APISERVER_BIN or %s", err, hint)
	}
	apiserver = filepath.Join(root, "_output", "tools", KubeVersion, "kube-apiserver")
	if _, err := os.Stat(apiserver); err != nil {
		return "", "", fmt.Errorf("kube-apiserver %s is not built (%s is missing): %s (builds it from source, a few minutes the first time) or set KUBE_APISERVER_BIN", KubeVersion, apiserver, hint)
	}
	return etcd, apiserver, nil
}

// RepoRoot walks up from the working directory (a package directory under
// go test) to the main module's root.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module github.com/netpol/netpol\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the github.com/netpol/netpol module")
		}
		dir = parent
	}
}

func (e *Env) startEtcd(ctx context.Context, bin string) error {
	// Data on tmpfs where there is one: etcd fsyncs every write, and the
	// data is thrown away anyway.
	dataDir := filepath.Join(e.Dir, "etcd")
	if e.keptEtcdDir != "" {
		dataDir = e.keptEtcdDir
	} else if st, err := os.Stat(shmDir); err == nil && st.IsDir() {
		dir, err := makeOwnedDir(shmDir, "netpol-testenv-etcd-")
		if err != nil {
			return err
		}
		e.etcdDataDir = dir
		dataDir = filepath.Join(dir, "data")
	}
	var env []string
	if runtime.GOARCH != "amd64" {
		env = append(env, "ETCD_UNSUPPORTED_ARCH="+runtime.GOARCH) // etcd 3.4 refuses to start without it
	}
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
		peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		args := []string{
			"--name=testenv",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=testenv=" + peer,
			"--initial-cluster-state=new",
			"--logger=zap",
			"--log-level=warn",
			// As kubeadm sets it: the apiserver's watch cache uses
			// progress notifications to keep its resource version fresh.
			"--experimental-watch-progress-notify-interval=5s",
		}
		p, err := startProcess("etcd", e.EtcdLog, bin, args, env)
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.etcd = p
		e.mu.Unlock()
		err = e.waitFor(ctx, p, client+"/health", func(code int, body string) bool {
			return code == http.StatusOK && strings.Contains(body, `"health":"true"`)
		}, http.DefaultClient)
		if err == nil {
			e.EtcdURL = client
			e.EtcdVersion, err = e.etcdVersion(ctx, client)
			return err
		}
		p.stop(0)
		if attempt < 3 && p.addrInUse() {
			if err := os.RemoveAll(dataDir); err != nil {
				return err
			}
			continue
		}
		return err
	}
}

// etcdVersion asks etcd for its server version ("3.4.23").
func (e *Env) etcdVersion(ctx context.Context, client string) (string, error) {
	code, body, err := e.get(ctx, http.DefaultClient, client+"/version")
	if err != nil {
		return "", fmt.Errorf("etcd version: %w", err)
	}
	var v struct {
		Server string `json:"etcdserver"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || code != http.StatusOK || v.Server == "" {
		return "", fmt.Errorf("etcd version: unexpected answer %d %q", code, body)
	}
	return v.Server, nil
}

// etcdSupportsWatchProgress mirrors kube-apiserver's check for etcd's
// RequestWatchProgress (k8s.io/apiserver/pkg/storage/feature): 3.4.31+ or
// 3.5.13+.
func etcdSupportsWatchProgress(version string) bool {
	var major, minor, patch int
	if _, err := fmt.Sscanf(version, "%d.%d.%d", &major, &minor, &patch); err != nil {
		return false
	}
	switch {
	case major != 3:
		return major > 3
	case minor == 4:
		return patch >= 31
	case minor == 5:
		return patch >= 13
	default:
		return minor > 5
	}
}

// apiserverArgs is kube-apiserver's command line; see docs/e2e.md for why
// each flag is there.
func apiserverArgs(dir, etcdURL, etcdVersion string, port int, pki *pki, tokenFile string, extra []string) []string {
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--tls-cert-file=" + pki.servingCert,
		"--tls-private-key-file=" + pki.servingKey,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki.serviceAccountPub,
		"--service-account-signing-key-file=" + pki.serviceAccountKey,
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--allow-privileged=true",
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none",
	}
	if !etcdSupportsWatchProgress(etcdVersion) {
		// With the WatchList gate on (the default), the apiserver turns a
		// watch without resourceVersion into sendInitialEvents=true, which
		// waits (3s at most, then a 504 "Too large resource version" error
		// event) until the watch cache has caught up with etcd's current
		// revision; without RequestWatchProgress (Debian's etcd 3.4.23) the
		// cache only catches up on its own resource's events. Off, such
		// watches start at once as before 1.34. Informers (list, then watch
		// from a resourceVersion) work either way.
		args = append(args, "--feature-gates=WatchList=false")
	}
	name := func(flag string) string {
		n, _, _ := strings.Cut(flag, "=")
		return n
	}
	for _, x := range extra {
		replaced := false
		for i, a := range args {
			if name(a) == name(x) {
				args[i], replaced = x, true
			}
		}
		if !replaced {
			args = append(args, x)
		}
	}
	return args
}

// StartAPIServer (re)starts kube-apiserver with the same etcd, port and
// credentials, and waits for /readyz. It is an error if it is running.
func (e *Env) StartAPIServer(ctx context.Context) error {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return errors.New("the environment is stopped")
	}
	if e.apiserver != nil {
		if done, _ := e.apiserver.exited(); !done {
			e.mu.Unlock()
			return errors.New("kube-apiserver is already running")
		}
	}
	p, err := startProcess("kube-apiserver", e.APIServerLog, e.apiBin, e.apiArgs, nil)
	if err != nil {
		e.mu.Unlock()
		return err
	}
	e.apiserver = p
	e.mu.Unlock()

	url := "https://127.0.0.1:" + flagValue(e.apiArgs, "--secure-port")
	err = e.waitFor(ctx, p, url+"/readyz", func(code int, body string) bool {
		return code == http.StatusOK && body == "ok"
	}, e.readyClient)
	if err != nil {
		// The verbose answer names the failing checks.
		if code, body, verr := e.get(ctx, e.readyClient, url+"/readyz?verbose"); verr == nil {
			err = fmt.Errorf("%w\n/readyz?verbose (%d):\n%s", err, code, body)
		}
		p.stop(0)
		return err
	}
	return nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 10s) and
// waits until it has exited; etcd and the data stay. Clients see
// connection errors until StartAPIServer.
func (e *Env) StopAPIServer() {
	e.mu.Lock()
	p := e.apiserver
	e.mu.Unlock()
	if p != nil {
		p.stop(10 * time.Second)
	}
}

// PIDs are the process IDs of etcd and kube-apiserver (0 for one not
// running), for benchmarks that read what the children cost (/proc).
func (e *Env) PIDs() (etcd, apiserver int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	pid := func(p *process) int {
		if p == nil || p.cmd.Process == nil {
			return 0
		}
		select {
		case <-p.done:
			return 0
		default:
			return p.cmd.Process.Pid
		}
	}
	return pid(e.etcd), pid(e.apiserver)
}

// Stop stops kube-apiserver and etcd and removes the environment's files.
// It is idempotent.
func (e *Env) Stop() {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return
	}
	e.stopped = true
	api, etcd := e.apiserver, e.etcd
	e.mu.Unlock()
	if api != nil {
		api.stop(10 * time.Second)
	}
	if etcd != nil {
		etcd.stop(5 * time.Second)
	}
	if e.etcdDataDir != "" {
		_ = os.RemoveAll(e.etcdDataDir)
	}
	if e.Dir != "" {
		if os.Getenv("TESTENV_KEEP_DIR") == "" {
			_ = os.RemoveAll(e.Dir)
		} else {
			_ = os.Remove(filepath.Join(e.Dir, ownerFile)) // kept: not stale
		}
	}
}

// waitFor polls url until ready accepts the answer, the process exits (an
// error with its log's tail), ctx ends or the start timeout passes.
func (e *Env) waitFor(ctx context.Context, p *process, url string, ready func(code int, body string) bool, client *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		if done, err := p.exited(); done {
			return p.exitError(err)
		}
		code, body, err := e.get(ctx, client, url)
		if err == nil && ready(code, body) {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v (last answer from %s: %s); last lines of %s:\n%s",
				p.name, e.timeout, url, last, p.logPath, p.tail(40))
		case <-tick.C:
		}
	}
}

func (e *Env) get(ctx context.Context, client *http.Client, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if strings.HasPrefix(url, "https:") {
		req.Header.Set("Authorization", "Bearer "+e.AdminToken)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body), err
}

// WriteKubeconfig writes a kubeconfig for the apiserver with the given
// bearer token, verifying the server with the environment's CA.
func (e *Env) WriteKubeconfig(path, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: e.Config.Host, CertificateAuthorityData: e.CAData}
	cfg.AuthInfos["testenv"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: "testenv", Namespace: "default"}
	cfg.CurrentContext = "testenv"
	return clientcmd.WriteToFile(*cfg, path)
}

// ServiceAccountConfig mints a token (TokenRequest, valid 1h) for an
// existing service account and returns a kubeconfig file and a rest.Config
// that authenticate as it, e.g. to run the agent with deploy/'s RBAC.
func (e *Env) ServiceAccountConfig(ctx context.Context, namespace, name string) (kubeconfig string, cfg *rest.Config, err error) {
	expiry := int64(3600)
	tr, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("token for service account %s/%s: %w", namespace, name, err)
	}
	cfg = rest.AnonymousClientConfig(e.Config)
	cfg.BearerToken = tr.Status.Token
	kubeconfig = filepath.Join(e.Dir, "kubeconfig-sa-"+namespace+"-"+name)
	if err := e.WriteKubeconfig(kubeconfig, tr.Status.Token); err != nil {
		return "", nil, err
	}
	return kubeconfig, cfg, nil
}

func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func writeTokenFile(path string, users []User) error {
	var b strings.Builder
	for i, u := range users {
		if u.Name == "" || u.Token == "" || strings.ContainsAny(u.Name+u.Token+strings.Join(u.Groups, ""), ",\"\n") {
			return fmt.Errorf("testenv: invalid user %q", u.Name)
		}
		fmt.Fprintf(&b, "%s,%s,uid-%d,\"%s\"\n", u.Token, u.Name, i, strings.Join(u.Groups, ","))
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freePort asks the kernel for a free loopback port. Another process can
// take it before the child binds it; the starts retry on "address already
// in use".
func freePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return tailLines(data, n)
}

const shmDir = "/dev/shm"

// ownerFile, in each directory an environment makes, holds the test
// process's pid: a process killed before its cleanup (SIGKILL, a panic in
// another goroutine) leaves its directories behind, and the next New
// removes those whose owner is gone. The children themselves die with the
// process (Pdeathsig).
const ownerFile = "owner.pid"

func makeOwnedDir(parent, prefix string) (string, error) {
	dir, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

func removeStaleDirs() {
	for _, pattern := range []string{
		filepath.Join(os.TempDir(), "netpol-testenv-*"),
		filepath.Join(shmDir, "netpol-testenv-etcd-*"),
	} {
		dirs, _ := filepath.Glob(pattern)
		for _, dir := range dirs {
			data, err := os.ReadFile(filepath.Join(dir, ownerFile))
			if err != nil {
				continue // not ours, or being made
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil || pid <= 0 || pid == os.Getpid() {
				continue
			}
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				_ = os.RemoveAll(dir)
			}
		}
	}
}
