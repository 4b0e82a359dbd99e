package helm_test

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// The release every case is rendered as.
const (
	release   = "sluice"
	namespace = "sluice"
)

// A rendered manifest: where it came from, its kind and name, and the typed
// object it decoded into (a map for the Prometheus Operator's kinds).
type manifest struct {
	source           string
	apiVersion, kind string
	name             string
	obj              any
	raw              []byte
}

// The typed object of every kind the chart may render, by apiVersion and
// kind; nil for the Prometheus Operator's, checked by hand.
var kinds = map[string]func() any{
	"apps/v1 Deployment":                      func() any { return new(appsv1.Deployment) },
	"v1 Service":                              func() any { return new(corev1.Service) },
	"v1 ConfigMap":                            func() any { return new(corev1.ConfigMap) },
	"policy/v1 PodDisruptionBudget":           func() any { return new(policyv1.PodDisruptionBudget) },
	"autoscaling/v2 HorizontalPodAutoscaler":  func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"batch/v1 Job":                            func() any { return new(batchv1.Job) },
	"monitoring.coreos.com/v1 ServiceMonitor": nil,
	"monitoring.coreos.com/v1 PrometheusRule": nil,
}

// render loads the chart, renders it as `helm install` would with the
// values file (empty: the defaults) in strict mode (a value the templates
// name that does not exist is an error), and decodes every document
// strictly into its Kubernetes type: an unknown or misspelt field, a wrong
// type or a malformed quantity fails the test.
func render(t *testing.T, valuesFile string) []manifest {
	t.Helper()
	out, err := renderFiles(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	var ms []manifest
	for _, source := range slices.Sorted(maps.Keys(out)) {
		if strings.HasSuffix(source, "NOTES.txt") {
			if strings.TrimSpace(out[source]) == "" {
				t.Errorf("%s is empty", source)
			}
			continue
		}
		for _, doc := range releaseutil.SplitManifests(out[source]) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			ms = append(ms, decode(t, source, []byte(doc)))
		}
	}
	if len(ms) == 0 {
		t.Fatal("the chart rendered nothing")
	}
	return ms
}

// renderFiles renders the chart with valuesFile, returning each template's
// output by name.
func renderFiles(valuesFile string) (map[string]string, error) {
	chrt, err := loader.Load("sluice")
	if err != nil {
		return nil, fmt.Errorf("load the chart: %w", err)
	}
	vals := chartutil.Values{}
	if valuesFile != "" {
		if vals, err = chartutil.ReadValuesFile(valuesFile); err != nil {
			return nil, err
		}
	}
	if err := chartutil.ProcessDependenciesWithMerge(chrt, vals); err != nil {
		return nil, fmt.Errorf("dependencies: %w", err)
	}
	opts := chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(chrt, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	out, err := engine.Engine{Strict: true}.Render(chrt, rv)
	if err != nil {
		return nil, fmt.Errorf("render with %q: %w", valuesFile, err)
	}
	return out, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

func decode(t *testing.T, source string, doc []byte) manifest {
	t.Helper()
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string            `json:"name"`
			Namespace string            `json:"namespace"`
			Labels    map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		t.Fatalf("%s: %v\n%s", source, err, doc)
	}
	m := manifest{source: source, apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name, raw: doc}
	newObj, ok := kinds[head.APIVersion+" "+head.Kind]
	if !ok {
		t.Fatalf("%s: unexpected %s %s", source, head.APIVersion, head.Kind)
	}
	if newObj == nil {
		var u map[string]any
		if err := yaml.UnmarshalStrict(doc, &u); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		m.obj = u
	} else {
		m.obj = newObj()
		if err := yaml.UnmarshalStrict(doc, m.obj); err != nil {
			t.Fatalf("%s: not a valid %s: %v\n%s", source, head.Kind, err, doc)
		}
	}
	for _, e := range validation.IsDNS1123Subdomain(m.name) {
		t.Errorf("%s: name %q: %s", source, m.name, e)
	}
	if head.Metadata.Namespace != namespace {
		t.Errorf("%s: namespace %q, want the release's %q", source, head.Metadata.Namespace, namespace)
	}
	checkLabels(t, source, head.Metadata.Labels)
	return m
}

func checkLabels(t *testing.T, where string, l map[string]string) {
	t.Helper()
	for k, v := range l {
		for _, e := range validation.IsQualifiedName(k) {
			t.Errorf("%s: label key %q: %s", where, k, e)
		}
		for _, e := range validation.IsValidLabelValue(v) {
			t.Errorf("%s: label %s=%q: %s", where, k, v, e)
		}
	}
}

// find returns the manifest of kind and name, failing the test if there is
// not exactly one.
func find[T any](t *testing.T, ms []manifest, kind, name string) T {
	t.Helper()
	var found []manifest
	for _, m := range ms {
		if m.kind == kind && m.name == name {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s %q, found %d (rendered: %s)", kind, name, len(found), names(ms))
	}
	return found[0].obj.(T)
}

func has(ms []manifest, kind string) bool {
	return slices.ContainsFunc(ms, func(m manifest) bool { return m.kind == kind })
}

func names(ms []manifest) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.kind+"/"+m.name)
	}
	return strings.Join(s, ", ")
}

// flags are the flags a command has (read from its source: the
// FlagSet calls of its serve command, and of internal/natsconn for the NATS
// security flags every command shares) with their defaults as README.md
// documents them, plus the SLUICE_ variables that are not flags
// (docs/operations.md, "Securing NATS").
type flags struct {
	exist    map[string]bool   // flag name, no dashes
	defaults map[string]string // flag name -> documented default
	vars     map[string]bool   // SLUICE_NATS_PASSWORD, SLUICE_NATS_TOKEN
}

var (
	flagCell = regexp.MustCompile("`--([a-z0-9-]+)")
	varCell  = regexp.MustCompile("`(SLUICE_[A-Z0-9_]+)`")
	flagDef  = regexp.MustCompile(`\bfs\.(?:String|Bool|Int|Int64|Uint|Uint64|Duration|Float64|Func|Var)(?:Var)?\((?:&[^,]+,\s*)?"([a-z0-9-]+)"`)
)

// sourceFlags adds the flags defined in the Go files of dir (skipping
// tests and the files named in skip: other subcommands').
func sourceFlags(t *testing.T, f *flags, dir string, skip ...string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") || slices.Contains(skip, filepath.Base(file)) {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flagDef.FindAllSubmatch(b, -1) {
			f.exist[string(m[1])] = true
			n++
		}
	}
	if n == 0 {
		t.Fatalf("%s: no flags found", dir)
	}
}

// documentedFlags reads the tables under the named headings of a Markdown
// file (each heading's section up to the next heading of any level).
func documentedFlags(t *testing.T, f *flags, file string, headings ...string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headings {
		in, rows := false, 0
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") {
				in = strings.TrimLeft(line, "# ") == h
				continue
			}
			if !in || !strings.HasPrefix(line, "| `") {
				continue
			}
			cells := strings.Split(line, "|")
			first := cells[1]
			def := ""
			if len(cells) > 3 {
				def = strings.Trim(strings.TrimSpace(cells[2]), "`")
			}
			for _, m := range flagCell.FindAllStringSubmatch(first, -1) {
				f.defaults[m[1]] = def
				rows++
			}
			for _, m := range varCell.FindAllStringSubmatch(first, -1) {
				f.vars[m[1]] = true
			}
		}
		if rows == 0 {
			t.Fatalf("%s: no flag table under %q", file, h)
		}
	}
	for name := range f.defaults {
		if len(f.exist) > 0 && !f.exist[name] {
			t.Errorf("%s documents --%s, which the command does not define", file, name)
		}
	}
}

func newFlags() flags {
	return flags{exist: map[string]bool{}, defaults: map[string]string{}, vars: map[string]bool{}}
}

func limiterFlags(t *testing.T) flags {
	f := newFlags()
	sourceFlags(t, &f, "../../cmd/limiter", "check.go", "top.go", "override.go")
	sourceFlags(t, &f, "../../internal/natsconn")
	documentedFlags(t, &f, "../../README.md", "Limiter flags", "Rate limit service (Envoy)")
	documentedFlags(t, &f, "../../docs/operations.md", "Securing NATS")
	return f
}

func bridgeFlags(t *testing.T) flags {
	f := newFlags()
	sourceFlags(t, &f, "../../cmd/bridge")
	sourceFlags(t, &f, "../../internal/natsconn")
	documentedFlags(t, &f, "../../README.md", "Bridge flags")
	documentedFlags(t, &f, "../../docs/operations.md", "Securing NATS")
	return f
}

// flagOf returns the flag an environment variable sets (SLUICE_NATS_URL:
// nats-url).
func flagOf(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "SLUICE_")), "_", "-")
}

// The image's facts, read from its Containerfile: entrypoint, command, user
// and exposed ports.
type image struct {
	entrypoint, cmd []string
	uid, gid        int64
	expose          []int32
}

func containerfile(t *testing.T, name string) image {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "container", name+".Containerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var im image
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		word, rest, _ := strings.Cut(line, " ")
		switch word {
		case "ENTRYPOINT":
			if err := yaml.Unmarshal([]byte(rest), &im.entrypoint); err != nil {
				t.Fatal(err)
			}
		case "CMD":
			if err := yaml.Unmarshal([]byte(rest), &im.cmd); err != nil {
				t.Fatal(err)
			}
		case "USER":
			u, g, _ := strings.Cut(rest, ":")
			im.uid, _ = strconv.ParseInt(u, 10, 64)
			im.gid, _ = strconv.ParseInt(g, 10, 64)
		case "EXPOSE":
			for _, p := range strings.Fields(rest) {
				n, err := strconv.ParseInt(p, 10, 32)
				if err != nil {
					t.Fatal(err)
				}
				im.expose = append(im.expose, int32(n))
			}
		}
	}
	if im.uid == 0 || len(im.entrypoint) == 0 {
		t.Fatalf("%s.Containerfile: no USER or ENTRYPOINT", name)
	}
	return im
}

// checkPod checks a pod template of the chart: names Kubernetes accepts,
// the image's user, probes on --metrics-addr's port, every environment
// variable and argument a documented flag of the command, mounts of
// volumes that exist. It returns the container's environment by name.
func checkPod(t *testing.T, where string, pod corev1.PodTemplateSpec, f flags, im image) map[string]corev1.EnvVar {
	t.Helper()
	spec := pod.Spec
	checkLabels(t, where+" pod", pod.Labels)
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", where, len(spec.Containers))
	}
	c := spec.Containers[0]
	for _, e := range validation.IsDNS1123Label(c.Name) {
		t.Errorf("%s: container name %q: %s", where, c.Name, e)
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.RunAsUser == nil || *sc.RunAsUser != im.uid || sc.RunAsGroup == nil || *sc.RunAsGroup != im.gid {
		t.Errorf("%s: pod security context %+v, want non-root as the image's %d:%d", where, spec.SecurityContext, im.uid, im.gid)
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: container security context %+v, want a read-only root and no privilege escalation", where, c.SecurityContext)
	}
	if len(c.Command) != 0 {
		t.Errorf("%s: command %q replaces the image's entrypoint %q", where, c.Command, im.entrypoint)
	}

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		for _, msg := range validation.IsEnvVarName(e.Name) {
			t.Errorf("%s: env %q: %s", where, e.Name, msg)
		}
		if _, dup := env[e.Name]; dup {
			t.Errorf("%s: env %s given twice", where, e.Name)
		}
		env[e.Name] = e
		if e.Value == "" && e.ValueFrom == nil {
			t.Errorf("%s: env %s has neither value nor valueFrom", where, e.Name)
		}
		if !strings.HasPrefix(e.Name, "SLUICE_") {
			continue
		}
		if !f.exist[flagOf(e.Name)] && !f.vars[e.Name] {
			t.Errorf("%s: env %s names no flag (--%s) of the command", where, e.Name, flagOf(e.Name))
		}
	}
	for i, a := range c.Args {
		if i == 0 {
			if a != "migrate" && a != "serve" {
				t.Errorf("%s: first argument %q, want a subcommand", where, a)
			}
			continue
		}
		name, _, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("%s: argument %q, want --flag=value", where, a)
			continue
		}
		if !f.exist[name] {
			t.Errorf("%s: argument %q names no flag of the command", where, a)
		}
	}

	ports := map[string]corev1.ContainerPort{}
	for _, p := range c.Ports {
		for _, e := range validation.IsValidPortName(p.Name) {
			t.Errorf("%s: port name %q: %s", where, p.Name, e)
		}
		for _, e := range validation.IsValidPortNum(int(p.ContainerPort)) {
			t.Errorf("%s: port %d: %s", where, p.ContainerPort, e)
		}
		ports[p.Name] = p
	}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		for _, e := range validation.IsDNS1123Label(v.Name) {
			t.Errorf("%s: volume %q: %s", where, v.Name, e)
		}
		volumes[v.Name] = true
	}
	for _, m := range c.VolumeMounts {
		if !volumes[m.Name] {
			t.Errorf("%s: mount of volume %q, which the pod does not have", where, m.Name)
		}
		if !m.ReadOnly {
			t.Errorf("%s: mount %q is writable; nothing should be", where, m.Name)
		}
	}

	if c.Args[0] == "migrate" {
		return env
	}
	// Probes: /healthz and /readyz on the port --metrics-addr listens on.
	addr := env["SLUICE_METRICS_ADDR"].Value
	_, port, ok := strings.Cut(addr, ":")
	if !ok {
		t.Fatalf("%s: SLUICE_METRICS_ADDR %q, want host:port", where, addr)
	}
	mp, ok := ports["metrics"]
	if !ok || strconv.Itoa(int(mp.ContainerPort)) != port {
		t.Errorf("%s: container port metrics %+v, want --metrics-addr's %s", where, mp, port)
	}
	if !slices.Contains(im.expose, mp.ContainerPort) {
		t.Errorf("%s: metrics port %d is not one the image exposes (%v)", where, mp.ContainerPort, im.expose)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an HTTP probe on %s", where, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Port.StrVal != "metrics" {
			t.Errorf("%s: probe %s on port %s, want %s on port metrics", where, g.Path, g.Port.String(), p.path)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: resources %+v, want CPU and memory requests and a memory limit", where, c.Resources)
	}
	// A stopping process settles within --shutdown-timeout: the kubelet
	// must wait longer before it kills it.
	shutdown, err := time.ParseDuration(f.defaults["shutdown-timeout"])
	if err != nil {
		t.Fatalf("--shutdown-timeout's documented default: %v", err)
	}
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--shutdown-timeout="); ok {
			if shutdown, err = time.ParseDuration(v); err != nil {
				t.Fatalf("%s: %s: %v", where, a, err)
			}
		}
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= shutdown {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want more than --shutdown-timeout (%v)", where, ptrString(g), shutdown)
	}
	return env
}

// checkSelects fails unless selector selects the pod template's labels.
func checkSelects(t *testing.T, where string, selector *metav1.LabelSelector, pod corev1.PodTemplateSpec) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		t.Fatalf("%s: selector: %v", where, err)
	}
	if sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("%s: selector %v does not select the pods (labels %v)", where, sel, pod.Labels)
	}
}

// checkService checks that a Service selects exactly one component's pods
// and that its ports lead to ports the container has.
func checkService(t *testing.T, svc *corev1.Service, dep *appsv1.Deployment, other *appsv1.Deployment) {
	t.Helper()
	for _, e := range validation.IsDNS1035Label(svc.Name) {
		t.Errorf("Service %s: %s", svc.Name, e)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	if sel.Empty() || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("Service %s: selector %v does not select %s's pods", svc.Name, sel, dep.Name)
	}
	if sel.Matches(labels.Set(other.Spec.Template.Labels)) {
		t.Errorf("Service %s: selector %v also selects %s's pods", svc.Name, sel, other.Name)
	}
	cports := map[string]int32{}
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		cports[p.Name] = p.ContainerPort
	}
	for _, p := range svc.Spec.Ports {
		for _, e := range validation.IsValidPortName(p.Name) {
			t.Errorf("Service %s: port name %q: %s", svc.Name, p.Name, e)
		}
		if _, ok := cports[p.TargetPort.StrVal]; !ok {
			t.Errorf("Service %s: port %s targets %q, which %s's container does not have", svc.Name, p.Name, p.TargetPort.String(), dep.Name)
		}
		if cports[p.TargetPort.StrVal] != p.Port {
			t.Errorf("Service %s: port %s is %d, the container's %d", svc.Name, p.Name, p.Port, cports[p.TargetPort.StrVal])
		}
	}
}

// chartCase is one values file and what its rendering must hold beyond
// what every rendering must.
type chartCase struct {
	name, values string
	check        func(t *testing.T, ms []manifest, limiterEnv, bridgeEnv map[string]corev1.EnvVar)
}

func TestChartRendersValidManifests(t *testing.T) {
	lf, bf := limiterFlags(t), bridgeFlags(t)
	limiterImage, bridgeImage := containerfile(t, "limiter"), containerfile(t, "bridge")
	for _, c := range []chartCase{
		{"defaults", "", checkDefaults},
		{"rls", "sluice/ci/rls-values.yaml", checkRLS},
		{"monitoring", "sluice/ci/monitoring-values.yaml", checkMonitoring},
		{"region-eu", "sluice/ci/region-eu-values.yaml", checkRegion},
	} {
		t.Run(c.name, func(t *testing.T) {
			ms := render(t, c.values)
			lim := find[*appsv1.Deployment](t, ms, "Deployment", "sluice-limiter")
			br := find[*appsv1.Deployment](t, ms, "Deployment", "sluice-bridge")
			for _, d := range []*appsv1.Deployment{lim, br} {
				checkSelects(t, "Deployment "+d.Name, d.Spec.Selector, d.Spec.Template)
			}
			le := checkPod(t, "limiter", lim.Spec.Template, lf, limiterImage)
			be := checkPod(t, "bridge", br.Spec.Template, bf, bridgeImage)
			checkService(t, find[*corev1.Service](t, ms, "Service", "sluice-limiter"), lim, br)
			checkService(t, find[*corev1.Service](t, ms, "Service", "sluice-bridge"), br, lim)
			for _, m := range ms {
				if pdb, ok := m.obj.(*policyv1.PodDisruptionBudget); ok {
					dep := map[string]*appsv1.Deployment{lim.Name: lim, br.Name: br}[pdb.Name]
					if dep == nil {
						t.Errorf("PodDisruptionBudget %s: no Deployment of that name", pdb.Name)
						continue
					}
					checkSelects(t, "PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector, dep.Spec.Template)
					if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MinAvailable != nil {
						t.Errorf("PodDisruptionBudget %s: want maxUnavailable alone (a drain never blocks forever)", pdb.Name)
					}
				}
				if job, ok := m.obj.(*batchv1.Job); ok {
					checkPod(t, "Job "+job.Name, job.Spec.Template, bf, bridgeImage)
				}
			}
			// Both components reach the same NATS, region, subjects and Redis.
			for _, name := range []string{"SLUICE_NATS_URL", "SLUICE_REGION", "SLUICE_SUBJECT_PREFIX", "SLUICE_REDIS_URL", "SLUICE_REDIS_PREFIX"} {
				if !reflect.DeepEqual(le[name], be[name]) {
					t.Errorf("%s: limiter %+v, bridge %+v", name, le[name], be[name])
				}
			}
			if _, ok := le["SLUICE_MYSQL_DSN"]; ok {
				t.Error("the limiter has SLUICE_MYSQL_DSN: only bridges reach MySQL")
			}
			c.check(t, ms, le, be)
		})
	}
}

// The defaults: two limiters and two bridges with budgets, Redis and MySQL
// from the Secrets sluice-redis and sluice-mysql, no Envoy port, nothing of
// the Prometheus Operator; every setting the chart passes with a value of
// its own is the flag's documented default, so installing the chart
// changes no behaviour of the binaries.
func checkDefaults(t *testing.T, ms []manifest, le, be map[string]corev1.EnvVar) {
	for _, kind := range []string{"HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule", "Job", "ConfigMap"} {
		if has(ms, kind) {
			t.Errorf("the defaults render a %s", kind)
		}
	}
	for _, name := range []string{"sluice-limiter", "sluice-bridge"} {
		d := find[*appsv1.Deployment](t, ms, "Deployment", name)
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
			t.Errorf("%s: replicas %v, want 2", name, d.Spec.Replicas)
		}
		find[*policyv1.PodDisruptionBudget](t, ms, "PodDisruptionBudget", name)
	}
	for _, s := range []struct {
		env                    map[string]corev1.EnvVar
		name, secret, key, who string
	}{
		{env: le, name: "SLUICE_REDIS_URL", secret: "sluice-redis", key: "url", who: "limiter"},
		{env: be, name: "SLUICE_REDIS_URL", secret: "sluice-redis", key: "url", who: "bridge"},
		{env: be, name: "SLUICE_MYSQL_DSN", secret: "sluice-mysql", key: "dsn", who: "bridge"},
	} {
		e, ok := s.env[s.name]
		if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != s.secret || e.ValueFrom.SecretKeyRef.Key != s.key {
			t.Errorf("%s: %s %+v, want it from Secret %s, key %s", s.who, s.name, e, s.secret, s.key)
		}
	}
	if _, ok := le["SLUICE_RLS_LISTEN"]; ok {
		t.Error("the defaults serve Envoy's rate limit service")
	}
	// Values the chart sets on purpose; every other literal is the default.
	own := map[string]bool{"nats-url": true, "metrics-addr": true}
	for who, c := range map[string]struct {
		env map[string]corev1.EnvVar
		f   flags
	}{"limiter": {le, limiterFlags(t)}, "bridge": {be, bridgeFlags(t)}} {
		for name, e := range c.env {
			flag := flagOf(name)
			if e.ValueFrom != nil || own[flag] {
				continue
			}
			if def, ok := c.f.defaults[flag]; ok && def != e.Value {
				t.Errorf("%s: %s=%q, but --%s's documented default is %q", who, name, e.Value, flag, def)
			}
		}
	}
}

// Envoy's rate limit service: the port the limiter listens on is the
// container's grpc-rls port and the Service's, the configuration is the
// ConfigMap mounted where --rls-config points, TLS files where the flags
// point; and examples/envoy-rls/istio.yaml names this Service.
func checkRLS(t *testing.T, ms []manifest, le, _ map[string]corev1.EnvVar) {
	lim := find[*appsv1.Deployment](t, ms, "Deployment", "sluice-limiter")
	c := lim.Spec.Template.Spec.Containers[0]
	_, port, _ := strings.Cut(le["SLUICE_RLS_LISTEN"].Value, ":")
	var cport int32
	for _, p := range c.Ports {
		if p.Name == "grpc-rls" {
			cport = p.ContainerPort
		}
	}
	if port == "" || strconv.Itoa(int(cport)) != port {
		t.Fatalf("SLUICE_RLS_LISTEN %q, container port grpc-rls %d", le["SLUICE_RLS_LISTEN"].Value, cport)
	}
	svc := find[*corev1.Service](t, ms, "Service", "sluice-limiter")
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == "grpc-rls" {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil || sp.AppProtocol == nil || *sp.AppProtocol != "grpc" {
		t.Fatalf("Service sluice-limiter: port grpc-rls %+v, want appProtocol grpc (HTTP/2 from Istio and Envoy Gateway)", sp)
	}

	cm := find[*corev1.ConfigMap](t, ms, "ConfigMap", "sluice-rls")
	if !strings.Contains(cm.Data["edge.yaml"], "domain: edge") {
		t.Errorf("ConfigMap sluice-rls: %v, want the values' edge.yaml", cm.Data)
	}
	mounts := map[string]string{} // path -> volume
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	vols := map[string]corev1.Volume{}
	for _, v := range lim.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols[mounts[le["SLUICE_RLS_CONFIG"].Value]]; v.ConfigMap == nil || v.ConfigMap.Name != cm.Name {
		t.Errorf("SLUICE_RLS_CONFIG %q is not where ConfigMap %s is mounted (%v)", le["SLUICE_RLS_CONFIG"].Value, cm.Name, mounts)
	}
	for _, name := range []string{"SLUICE_RLS_TLS_CERT", "SLUICE_RLS_TLS_KEY", "SLUICE_RLS_TLS_CLIENT_CA"} {
		dir := filepath.Dir(le[name].Value)
		if v := vols[mounts[dir]]; v.Secret == nil || v.Secret.SecretName != "sluice-rls-tls" {
			t.Errorf("%s %q is not in the mounted Secret sluice-rls-tls", name, le[name].Value)
		}
	}
	if le["SLUICE_RLS_RESPONSE_HEADERS"].Value != "true" {
		t.Errorf("SLUICE_RLS_RESPONSE_HEADERS %+v, want true", le["SLUICE_RLS_RESPONSE_HEADERS"])
	}
	if !slices.Contains(c.Args, "--max-waiting-checks=2048") {
		t.Errorf("args %q, want the values' flags as --name=value", c.Args)
	}

	// The Istio example points at this Service, and its Service document is
	// this one (for installs without the chart).
	b, err := os.ReadFile("../../examples/envoy-rls/istio.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	var ex corev1.Service
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &ex); err != nil {
		t.Fatalf("istio.yaml: %v", err)
	}
	if ex.Name != svc.Name || ex.Namespace != svc.Namespace {
		t.Errorf("istio.yaml: Service %s/%s, the chart's (release %s in %s) is %s/%s", ex.Namespace, ex.Name, release, namespace, svc.Namespace, svc.Name)
	}
	if !reflect.DeepEqual(ex.Spec.Selector, svc.Spec.Selector) {
		t.Errorf("istio.yaml: selector %v, the chart's %v", ex.Spec.Selector, svc.Spec.Selector)
	}
	if len(ex.Spec.Ports) != 1 || ex.Spec.Ports[0].Name != sp.Name || ex.Spec.Ports[0].Port != sp.Port {
		t.Errorf("istio.yaml: ports %+v, the chart's grpc-rls is %+v", ex.Spec.Ports, *sp)
	}
	cluster := fmt.Sprintf("cluster_name: outbound|%d||%s.%s.svc.cluster.local", sp.Port, svc.Name, svc.Namespace)
	if !strings.Contains(docs[1], cluster) {
		t.Errorf("istio.yaml: the EnvoyFilter does not say %q", cluster)
	}
}

// Autoscaling and the Prometheus Operator's objects: the HPA drives the
// limiters' Deployment (which then leaves replicas to it), the
// ServiceMonitor scrapes the port "metrics" of both Services, the rules and
// the dashboard are monitoring/'s.
func checkMonitoring(t *testing.T, ms []manifest, _, _ map[string]corev1.EnvVar) {
	lim := find[*appsv1.Deployment](t, ms, "Deployment", "sluice-limiter")
	if lim.Spec.Replicas != nil {
		t.Errorf("Deployment sluice-limiter: replicas %d set while autoscaled", *lim.Spec.Replicas)
	}
	hpa := find[*autoscalingv2.HorizontalPodAutoscaler](t, ms, "HorizontalPodAutoscaler", "sluice-limiter")
	if r := hpa.Spec.ScaleTargetRef; r.APIVersion != "apps/v1" || r.Kind != "Deployment" || r.Name != lim.Name {
		t.Errorf("HPA targets %+v", r)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 12 || len(hpa.Spec.Metrics) != 1 {
		t.Errorf("HPA spec %+v", hpa.Spec)
	}
	if c := lim.Spec.Template.Spec.Containers[0]; c.Resources.Requests.Cpu().IsZero() {
		t.Error("a CPU-utilization HPA needs a CPU request")
	}

	sm := find[map[string]any](t, ms, "ServiceMonitor", "sluice")
	var smSpec struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	}
	reencode(t, sm["spec"], &smSpec)
	if len(smSpec.Endpoints) != 1 || smSpec.Endpoints[0].Port != "metrics" || smSpec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v, want port metrics, path /metrics", smSpec.Endpoints)
	}
	if !slices.Equal(smSpec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor namespaces %v", smSpec.NamespaceSelector.MatchNames)
	}
	sel, err := metav1.LabelSelectorAsSelector(&smSpec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sluice-limiter", "sluice-bridge"} {
		svc := find[*corev1.Service](t, ms, "Service", name)
		if !sel.Matches(labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor selector %v misses Service %s (%v)", sel, name, svc.Labels)
		}
	}
	if labelsOf(t, sm)["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels lack the values' release=prometheus")
	}

	rule := find[map[string]any](t, ms, "PrometheusRule", "sluice")
	var want map[string]any
	b, err := os.ReadFile("../../monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(rule) != 4 || !reflect.DeepEqual(rule["spec"], want) {
		t.Errorf("PrometheusRule: spec differs from monitoring/alerts.yml, or fields beyond apiVersion, kind, metadata, spec")
	}
	var groups struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	reencode(t, rule["spec"], &groups)
	alerts := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if g.Name == "" || r.Alert == "" || r.Expr == "" {
				t.Errorf("PrometheusRule: group %q rule %+v lacks a name, alert or expr", g.Name, r)
			}
			alerts++
		}
	}
	if alerts == 0 {
		t.Error("PrometheusRule: no rules")
	}

	cm := find[*corev1.ConfigMap](t, ms, "ConfigMap", "sluice-dashboard")
	dash, err := os.ReadFile("../../monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(cm.Data["sluice.json"]) != strings.TrimSpace(string(dash)) {
		t.Error("ConfigMap sluice-dashboard: sluice.json is not monitoring/dashboard.json")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("ConfigMap sluice-dashboard: labels %v, want grafana_dashboard=1 for Grafana's sidecar", cm.Labels)
	}
}

// A region of a supercluster with the NATS chart: limiters and bridges use
// the NATS chart's Service, the region and the regions list are passed, the
// NATS secrets are mounted where the flags point, the migration runs as a
// hook, and the NATS values name a gateway for every region.
func checkRegion(t *testing.T, ms []manifest, le, be map[string]corev1.EnvVar) {
	// The NATS chart names its Service <release>-nats (its fullname).
	if got := le["SLUICE_NATS_URL"].Value; got != "nats://sluice-nats:4222" {
		t.Errorf("SLUICE_NATS_URL %q, want the NATS chart's Service nats://sluice-nats:4222", got)
	}
	if le["SLUICE_REGION"].Value != "eu" || be["SLUICE_REGIONS"].Value != "us,eu,ap" {
		t.Errorf("SLUICE_REGION %+v, SLUICE_REGIONS %+v", le["SLUICE_REGION"], be["SLUICE_REGIONS"])
	}
	for _, name := range []string{"sluice-limiter", "sluice-bridge"} {
		d := find[*appsv1.Deployment](t, ms, "Deployment", name)
		env := le
		if name == "sluice-bridge" {
			env = be
		}
		mounts := map[string]string{}
		for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
			mounts[m.MountPath] = m.Name
		}
		vols := map[string]corev1.Volume{}
		for _, v := range d.Spec.Template.Spec.Volumes {
			vols[v.Name] = v
		}
		for file, secret := range map[string]string{
			"SLUICE_NATS_CREDS": "sluice-nats-creds", "SLUICE_NATS_TLS_CA": "sluice-nats-tls",
			"SLUICE_NATS_TLS_CERT": "sluice-nats-tls", "SLUICE_NATS_TLS_KEY": "sluice-nats-tls",
		} {
			v := vols[mounts[filepath.Dir(env[file].Value)]]
			if v.Secret == nil || v.Secret.SecretName != secret {
				t.Errorf("%s: %s %q is not in the mounted Secret %s", name, file, env[file].Value, secret)
			}
		}
		if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--sweep-interval=30s") && name == "sluice-bridge" {
			t.Errorf("%s: args %q lack --sweep-interval=30s", name, d.Spec.Template.Spec.Containers[0].Args)
		}
	}
	job := find[*batchv1.Job](t, ms, "Job", "sluice-migrate")
	if job.Annotations["helm.sh/hook"] != "pre-install,pre-upgrade" {
		t.Errorf("Job sluice-migrate: annotations %v, want a pre-install,pre-upgrade hook", job.Annotations)
	}
	c := job.Spec.Template.Spec.Containers[0]
	if !slices.Equal(c.Args, []string{"migrate"}) || len(c.Env) != 1 || c.Env[0].ValueFrom.SecretKeyRef.Name != "sluice-mysql-admin" {
		t.Errorf("Job sluice-migrate: args %q env %+v", c.Args, c.Env)
	}

	// The NATS chart is the dependency the values enable.
	chrt, err := loader.Load("sluice")
	if err != nil {
		t.Fatal(err)
	}
	deps := chrt.Metadata.Dependencies
	if len(deps) != 1 || deps[0].Name != "nats" || deps[0].Condition != "nats.enabled" ||
		deps[0].Repository != "https://nats-io.github.io/k8s/helm/charts/" {
		t.Errorf("Chart.yaml dependencies %+v, want the NATS chart on condition nats.enabled", deps)
	}

	// The NATS chart's values: a cluster named for the region, and a
	// gateway to every region of the deployment (its own included).
	vals, err := chartutil.ReadValuesFile("sluice/ci/region-eu-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var nats struct {
		Enabled bool `json:"enabled"`
		Config  struct {
			Cluster struct {
				Enabled bool `json:"enabled"`
				Merge   struct {
					Name string `json:"name"`
				} `json:"merge"`
			} `json:"cluster"`
			Gateway struct {
				Enabled bool `json:"enabled"`
				Merge   struct {
					Name     string `json:"name"`
					Gateways []struct {
						Name string   `json:"name"`
						URLs []string `json:"urls"`
					} `json:"gateways"`
				} `json:"merge"`
			} `json:"gateway"`
		} `json:"config"`
	}
	reencode(t, vals["nats"], &nats)
	cfg := nats.Config
	if !nats.Enabled || !cfg.Cluster.Enabled || !cfg.Gateway.Enabled || cfg.Cluster.Merge.Name != "eu" || cfg.Gateway.Merge.Name != "eu" {
		t.Errorf("NATS values %+v: want the chart, a cluster and a gateway named eu", nats)
	}
	var gws []string
	for _, g := range cfg.Gateway.Merge.Gateways {
		if len(g.URLs) == 0 {
			t.Errorf("gateway %s has no URL", g.Name)
		}
		gws = append(gws, g.Name)
	}
	sort.Strings(gws)
	if !slices.Equal(gws, []string{"ap", "eu", "us"}) {
		t.Errorf("gateways %v, want one per region of SLUICE_REGIONS", gws)
	}
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

func reencode(t *testing.T, v any, into any) {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatal(err)
	}
}

func labelsOf(t *testing.T, obj map[string]any) map[string]string {
	var meta metav1.ObjectMeta
	reencode(t, obj["metadata"], &meta)
	return meta.Labels
}

// The chart's copies of the alert rules and the dashboard are monitoring/'s
// (Helm reads only files inside a chart).
func TestChartMonitoringFilesAreCurrent(t *testing.T) {
	for _, f := range []string{"alerts.yml", "dashboard.json"} {
		want, err := os.ReadFile(filepath.Join("..", "..", "monitoring", f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("sluice", "files", f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/helm/sluice/files/%s differs from monitoring/%s: cp monitoring/%s deploy/helm/sluice/files/", f, f, f)
		}
	}
}

// Values that cannot work are refused at render time (by the templates or
// values.schema.json) with a message that says what to set, not deployed to
// fail later: a misspelt value is an error, not a setting silently ignored.
func TestChartRefusesIncompleteValues(t *testing.T) {
	for _, c := range []struct {
		name, values, want string
	}{
		{"no NATS", "natsUrl: \"\"\n", "set natsUrl"},
		{"RLS without configuration", "limiter:\n  rls:\n    enabled: true\n", "limiter.rls.config"},
		{"RLS file the limiter skips", "limiter:\n  rls:\n    enabled: true\n    config:\n      edge.conf: \"domain: edge\"\n", "only *.yaml and *.yml"},
		{"migration without a DSN", "bridge:\n  migrate:\n    enabled: true\n", "bridge.migrate.existingSecret"},
		{"a misspelt value", "limiter:\n  replica: 3\n", "replica"},
		{"a region NATS refuses", "region: eu.west\n", "region"},
		{"a log level the commands refuse", "logLevel: verbose\n", "logLevel"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte(c.values), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := renderFiles(f)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("render: %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// Every documented value of values.yaml is used by a template: a value no
// template reads is a setting that silently does nothing.
func TestChartValuesAreAllUsed(t *testing.T) {
	vals, err := chartutil.ReadValuesFile("sluice/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tpl strings.Builder
	entries, err := os.ReadDir("sluice/templates")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("sluice", "templates", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		tpl.Write(b)
	}
	text := tpl.String()
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if prefix == "" && k == "nats" {
				continue // the NATS chart's values
			}
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && !leafMap(prefix+k) {
				walk(prefix+k+".", sub)
				continue
			}
			// A template names a value by its last key (.replicas,
			// $l.rls.port, .Values.logLevel).
			if !regexp.MustCompile(`\.` + regexp.QuoteMeta(k) + `\b`).MatchString(text) {
				t.Errorf("value %s%s is used by no template", prefix, k)
			}
		}
	}
	walk("", vals)
}

// leafMap reports whether a value is a map passed whole to a manifest
// (resources, security contexts, probes' settings, labels).
func leafMap(path string) bool {
	for _, suffix := range []string{"resources", "SecurityContext", "securityContext", "labels", "liveness", "readiness", "requests", "limits", "capabilities", "seccompProfile"} {
		if strings.HasSuffix(path, suffix) {
			return true
		}
	}
	return false
}
