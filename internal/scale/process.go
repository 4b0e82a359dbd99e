package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// buildCommands builds cmd/limiter and cmd/bridge into dir.
func buildCommands(ctx context.Context, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir,
		"github.com/sluicehq/sluice/cmd/limiter", "github.com/sluicehq/sluice/cmd/bridge")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
}

// process is a limiter or a bridge running as its own OS process, with its
// Prometheus endpoint, so that its CPU and heap are its own.
type process struct {
	name    string // e.g. "bridge eu"
	cmd     *exec.Cmd
	done    chan struct{}
	exitErr error
	metrics string // http://host:port/metrics
	started time.Time
	// gcs holds the collections the runtime reported, when the process
	// runs with GODEBUG=gctrace=1.
	gcs gcTrace
}

// metricsLine is what limiter and bridge print on stdout once they serve
// their metrics.
const metricsLine = "metrics on "

// startProcess runs bin with args plus --metrics-addr on a free loopback
// port, and env added to this process's environment, and returns once it
// serves its metrics (within wait; 0: 30s). Its stdout and stderr go to
// logw, each line prefixed with name; the runtime's gctrace lines, if any,
// are also recorded.
func startProcess(ctx context.Context, name, bin string, logw io.Writer, env []string, wait time.Duration, args ...string) (*process, error) {
	if wait <= 0 {
		wait = 30 * time.Second
	}
	args = append(args, "--metrics-addr", "127.0.0.1:0")
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), started: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	addr := make(chan string, 1)
	var pipes sync.WaitGroup
	pipes.Go(func() { copyLines(stdout, logw, name, addr, nil) })
	pipes.Go(func() { copyLines(stderr, logw, name, nil, p.gcs.line) })
	go func() {
		pipes.Wait()
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	select {
	case a := <-addr:
		p.metrics = a
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited at start: %v", name, p.exitErr)
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	case <-time.After(wait):
		p.kill()
		return nil, fmt.Errorf("%s: no metrics address within %v", name, wait)
	}
}

// copyLines copies r to w line by line, prefixed with name; the first line
// announcing the metrics address is sent to addr, and every line to onLine
// (unless nil).
func copyLines(r io.Reader, w io.Writer, name string, addr chan<- string, onLine func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if onLine != nil {
			onLine(line)
		}
		if addr != nil {
			if _, rest, ok := strings.Cut(line, metricsLine); ok {
				url, _, _ := strings.Cut(rest, " ")
				addr <- url
				addr = nil
			}
		}
		fmt.Fprintf(w, "%s: %s\n", name, line)
	}
}

// stop sends SIGTERM and waits up to timeout for the exit, then kills. It
// returns the exit error (nil for status 0).
func (p *process) stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exitErr
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM", p.name, timeout)
	}
}

// kill ends the process at once and waits for it.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// metricSet is one scrape of a Prometheus text endpoint: each series' value
// by its name with labels as written ("name" or `name{a="b"}`).
type metricSet map[string]float64

// scrape reads p's metrics.
func (p *process) scrape(ctx context.Context) (metricSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metrics, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: scrape: %w", p.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: scrape: %s", p.name, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format: comments are skipped, a
// sample is "series value [timestamp]".
func parseMetrics(r io.Reader) (metricSet, error) {
	out := metricSet{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		// Label values may hold spaces; the value follows the closing brace.
		rest := line
		series := ""
		if i := strings.LastIndexByte(line, '}'); i >= 0 {
			series, rest = line[:i+1], line[i+1:]
		} else {
			series, rest, _ = strings.Cut(line, " ")
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", line, err)
		}
		out[series] = v
	}
	return out, sc.Err()
}

// get returns the value of the series named name summed over its labels,
// and whether there was any.
func (m metricSet) get(name string) (float64, bool) {
	var sum float64
	found := false
	for series, v := range m {
		if series == name || (strings.HasPrefix(series, name) && series[len(name)] == '{') {
			sum += v
			found = true
		}
	}
	return sum, found
}

// value is get without the flag: 0 when absent.
func (m metricSet) value(name string) float64 {
	v, _ := m.get(name)
	return v
}

// waitMetric polls p until its metric name reaches at least want, and
// returns how long after the process started that was.
func waitMetric(ctx context.Context, p *process, name string, want float64, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		if p.exited() {
			return 0, fmt.Errorf("%s exited: %v", p.name, p.exitErr)
		}
		m, err := p.scrape(ctx)
		if err == nil && m.value(name) >= want {
			return time.Since(p.started), nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("timed out")
			}
			return 0, fmt.Errorf("%s: %s did not reach %v within %v: %w", p.name, name, want, timeout, err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// liveHeap estimates p's live heap: the lowest go_memstats_heap_alloc_bytes
// seen while sampling for d (right after a collection the allocated heap is
// the live heap), with the last heap in use. A scrape that fails is
// skipped; it fails only when none answered.
func liveHeap(ctx context.Context, p *process, d time.Duration) (alloc, inuse float64, err error) {
	alloc = -1
	end := time.Now().Add(d)
	for {
		m, serr := p.scrape(ctx)
		if serr == nil {
			if a := m.value("go_memstats_heap_alloc_bytes"); alloc < 0 || a < alloc {
				alloc = a
			}
			inuse = m.value("go_memstats_heap_inuse_bytes")
		} else {
			err = serr
		}
		if time.Now().After(end) {
			if alloc < 0 {
				return 0, 0, err
			}
			return alloc, inuse, nil
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tempDir makes a directory for the scenario's binaries.
func tempDir(pattern string) (string, func(), error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// binPath returns the path of a built command in dir.
func binPath(dir, name string) string { return filepath.Join(dir, name) }

// gcTrace records, from the lines GODEBUG=gctrace=1 makes the runtime
// print ("gc 7 @1.2s 1%: ... 12->13->6 MB, 14 MB goal, ..."), the live heap
// each collection marked (the third of the heap sizes, in MiB) and when the
// line was read. A scrape cannot give that figure: go_memstats_heap_alloc
// holds the garbage made since the last collection, and a policy table's
// metrics make a lot of it at each scrape (see PoliciesResult).
type gcTrace struct {
	mu      sync.Mutex
	samples []gcSample
	grew    chan struct{} // closed, and replaced, at each sample
}

type gcSample struct {
	at   time.Time
	live float64 // bytes
}

// gcLine matches a gctrace line's heap sizes before, after and live.
var gcLine = regexp.MustCompile(`^gc \d+ @.* (\d+)->(\d+)->(\d+) MB, `)

// line records line if it is a gctrace line.
func (g *gcTrace) line(line string) {
	m := gcLine.FindStringSubmatch(line)
	if m == nil {
		return
	}
	live, err := strconv.ParseFloat(m[3], 64)
	if err != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.samples = append(g.samples, gcSample{at: time.Now(), live: live * (1 << 20)})
	if g.grew != nil {
		close(g.grew)
		g.grew = nil
	}
}

// collections waits up to timeout for n collections ending after since.
// The runtime collects at least every two minutes.
func (p *process) collections(ctx context.Context, since time.Time, n int, timeout time.Duration) error {
	g := &p.gcs
	deadline := time.After(timeout)
	for {
		g.mu.Lock()
		_, seen := g.leastLocked(since, time.Now())
		if seen >= n {
			g.mu.Unlock()
			return nil
		}
		if g.grew == nil {
			g.grew = make(chan struct{})
		}
		grew := g.grew
		g.mu.Unlock()
		select {
		case <-grew:
		case <-p.done:
			return fmt.Errorf("%s exited: %v", p.name, p.exitErr)
		case <-deadline:
			return fmt.Errorf("%s: %d collections reported within %v, want %d (is it run with GODEBUG=gctrace=1?)", p.name, seen, timeout, n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// least returns the least live heap the collections ending in (from, to]
// marked (bytes; resolution 1 MiB; NaN when none did), and how many there
// were. What a collection marks includes what was allocated while it ran
// (a scrape's copy of a large policy table, a snapshot being sent), so the
// least of several is the closest to the live heap.
func (g *gcTrace) least(from, to time.Time) (float64, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leastLocked(from, to)
}

func (g *gcTrace) leastLocked(from, to time.Time) (float64, int) {
	least, n := math.Inf(1), 0
	for _, s := range g.samples {
		if s.at.After(from) && !s.at.After(to) {
			n++
			least = min(least, s.live)
		}
	}
	if n == 0 {
		return math.NaN(), 0
	}
	return least, n
}
