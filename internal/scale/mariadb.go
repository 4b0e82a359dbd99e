package scale

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // the driver of the private server's connections
)

// mariaDB is a private mariadbd for one scenario: its own data directory,
// socket and loopback port, so that the server's global status counters
// count only what the scenario's bridges do.
type mariaDB struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan error
	db   *sql.DB
}

// findBinary returns the first of names found on PATH or in /usr/sbin (where
// Debian puts mariadbd, outside a non-root user's PATH).
func findBinary(names ...string) (string, error) {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		if p := filepath.Join("/usr/sbin", n); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("none of %v installed (run make services: it installs mariadb-server)", names)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// startMariaDB installs a fresh data directory under a temporary directory
// and starts mariadbd on it, listening on a free loopback port. Root may log
// in over TCP without a password. Close stops it and removes the directory.
func startMariaDB(ctx context.Context, logf func(string, ...any)) (*mariaDB, error) {
	install, err := findBinary("mariadb-install-db", "mysql_install_db")
	if err != nil {
		return nil, err
	}
	server, err := findBinary("mariadbd", "mysqld")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-scale-db-")
	if err != nil {
		return nil, err
	}
	m := &mariaDB{dir: dir}
	// As root, mariadbd refuses to run unless told to run as root: the
	// data directory belongs to whoever runs the scenario.
	var asUser []string
	if os.Geteuid() == 0 {
		asUser = []string{"--user=root"}
	}
	args := append([]string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db"}, asUser...)
	if out, err := exec.CommandContext(ctx, install, args...).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: %v\n%s", install, err, out)
	}
	// A port picked free may be taken before mariadbd binds it: try again.
	for attempt := 0; ; attempt++ {
		err = m.start(ctx, server, asUser)
		if err == nil {
			logf("private mariadbd on 127.0.0.1:%d (data in %s)", m.port, dir)
			return m, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			m.Close()
			return nil, err
		}
	}
}

func (m *mariaDB) start(ctx context.Context, server string, asUser []string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	m.port = port
	args := append([]string{"--no-defaults",
		"--datadir=" + filepath.Join(m.dir, "data"),
		"--socket=" + filepath.Join(m.dir, "mysqld.sock"),
		"--pid-file=" + filepath.Join(m.dir, "mysqld.pid"),
		"--log-error=" + filepath.Join(m.dir, "error.log"),
		"--bind-address=127.0.0.1", "--port=" + strconv.Itoa(port),
		// A million components and their index fit in memory, as they
		// would on a server sized for them.
		"--innodb-buffer-pool-size=512M",
		"--max-connections=500",
	}, asUser...)
	m.cmd = exec.Command(server, args...)
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		return err
	}
	m.done = make(chan error, 1)
	go func() { m.done <- m.cmd.Wait() }()
	db, err := sql.Open("mysql", m.DSN(""))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err = db.PingContext(pctx)
		cancel()
		if err == nil {
			m.db = db
			return nil
		}
		select {
		case exit := <-m.done:
			db.Close()
			m.cmd = nil
			return fmt.Errorf("mariadbd exited (%v): %s", exit, m.errorLog())
		case <-ctx.Done():
			db.Close()
			m.stop()
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			db.Close()
			m.stop()
			return fmt.Errorf("mariadbd does not answer on port %d within 60s: %v", m.port, err)
		}
	}
}

func (m *mariaDB) errorLog() string {
	b, _ := os.ReadFile(filepath.Join(m.dir, "error.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], "\n")
}

// DSN returns the DSN of database on the server (none: "").
func (m *mariaDB) DSN(database string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s", m.port, database)
}

// status returns the server's global status counters named.
func (m *mariaDB) status(ctx context.Context, names ...string) (map[string]float64, error) {
	// Only those named, so that reading sends few rows (they count in
	// Rows_sent). The names are the package's constants, quoted here since
	// SHOW takes no placeholders.
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = "'" + strings.ReplaceAll(n, "'", "''") + "'"
	}
	rows, err := m.db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ("+strings.Join(quoted, ",")+")")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return nil, err
		}
		if want[name] {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return nil, fmt.Errorf("status %s: %w", name, err)
			}
			out[name] = v
		}
	}
	return out, rows.Err()
}

// cpuSeconds returns the CPU time mariadbd has used, from /proc.
func (m *mariaDB) cpuSeconds() (float64, error) {
	if m.cmd == nil || m.cmd.Process == nil {
		return 0, errors.New("mariadbd not running")
	}
	return procCPUSeconds(m.cmd.Process.Pid)
}

// procCPUSeconds reads a process's user plus system time from
// /proc/<pid>/stat (in clock ticks of 1/100 s, the value Linux reports to
// user space on every architecture Go supports).
func procCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it follow
	// the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / 100, nil
}

// Close stops mariadbd and removes its directory.
func (m *mariaDB) Close() {
	if m.db != nil {
		m.db.Close()
	}
	m.stop()
	os.RemoveAll(m.dir)
}

// stop ends mariadbd, if it runs: SIGTERM, then SIGKILL after 30s.
func (m *mariaDB) stop() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
	m.cmd = nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
