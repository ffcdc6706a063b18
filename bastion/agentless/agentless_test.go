package agentless

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// The shell side runs here as sshd would run it — `/bin/sh -c LINE` with the account's HOME —
// without sshd: these tests are about the script and the lines, the integration tests about
// the SSH around them.

// hostile are commands whose bytes must reach /bin/sh -c unchanged.
var hostile = []string{
	"echo \"it's $(echo sub) ${HOME+set} `echo tick`\"",
	"printf '%s\\n' 'a'\\''b' \"c'd\"",
	"echo one\necho two; echo 'three\nfour'",
	`echo '\'; echo "\\"; echo $'x'`,
	"echo ';' '&&' '|' '>' '<' '*' '?' '[a]' '#not a comment'",
	"'",
	"\"",
	"echo é 日本 \t tab",
}

func newID(t *testing.T) string {
	t.Helper()
	id, err := markers.NewExecutionID(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// shell runs line as the login shell would, in home, with stdin.
func shell(t *testing.T, home, line, stdin string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", line)
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin"}
	cmd.Dir = home
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func install(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	out, errb, code := shell(t, home, InstallLine(), Script)
	if code != 0 || out != ScriptSHA256()+"  -\n" {
		t.Fatalf("install: exit %d, stdout %q, stderr %q", code, out, errb)
	}
	for _, p := range []string{".postern", ".postern/markers", ".postern/run"} {
		info, err := os.Stat(filepath.Join(home, p))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v; want 0700", p, info.Mode().Perm())
		}
	}
	return home
}

// answerOf parses the first answer line of a stream.
func answerOf(t *testing.T, stream string) Answer {
	t.Helper()
	a, err := FindAnswer([]byte(stream))
	if err != nil {
		t.Fatalf("%v in %q", err, stream)
	}
	return a
}

func wrapped(t *testing.T, c Command) string {
	t.Helper()
	l, err := WrappedLine(c, ScriptSHA256())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestQuoteIsOneWord(t *testing.T) {
	for _, s := range append(hostile, "", "plain") {
		out, _, code := shell(t, t.TempDir(), "printf %s "+Quote(s), "")
		if code != 0 || out != s {
			t.Errorf("Quote(%q) came back as %q (exit %d)", s, out, code)
		}
	}
}

func FuzzQuote(f *testing.F) {
	for _, s := range hostile {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.IndexByte(s, 0) >= 0 {
			return // no argument holds NUL; the bastion refuses such commands
		}
		cmd := exec.Command("/bin/sh", "-c", "printf %s "+Quote(s))
		out, err := cmd.Output()
		if err != nil || string(out) != s {
			t.Fatalf("Quote(%q) came back as %q (%v)", s, out, err)
		}
	})
}

func FuzzParseAnswer(f *testing.F) {
	for _, s := range []string{
		Prefix + "started id=ex_01JDQ0000000000000000000AB",
		Prefix + "duplicate id=ex_01JDQ0000000000000000000AB state=exited exit=3",
		Prefix + "status id=ex_01JDQ0000000000000000000AB state=claimed old=1 retention_days=30",
		Prefix + "refused reason=cwd",
		Prefix + "status state=",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAnswer(s)
		if err != nil {
			return
		}
		if a.State == Exited && a.Exit == nil || a.Kind == Refused && a.Reason == "" {
			t.Fatalf("accepted an inconsistent answer %q: %+v", s, a)
		}
	})
}

// TestHostileCommandsRunVerbatim: each command reaches /bin/sh -c byte for byte, under the
// wrapper and without it, and its marker records it.
func TestHostileCommandsRunVerbatim(t *testing.T) {
	home := install(t)
	for _, cmdline := range hostile {
		want, _, wantCode := shell(t, home, "/bin/sh -c "+Quote(cmdline), "")
		for _, level := range []string{"plain", "wrapped"} {
			c := Command{ID: newID(t), Line: cmdline, Export: map[string]string{"POSTERN_EXECUTION_ID": "", "X_VALUE": "a'b\n$(c)"}}
			c.Export["POSTERN_EXECUTION_ID"] = c.ID
			var l string
			if level == "plain" {
				var err error
				if l, err = PlainLine(c); err != nil {
					t.Fatal(err)
				}
			} else {
				l = wrapped(t, c)
			}
			out, errb, code := shell(t, home, l, "")
			if out != want || code != wantCode {
				t.Errorf("%s %q: stdout %q exit %d; want %q exit %d (stderr %q)", level, cmdline, out, code, want, wantCode, errb)
			}
			if a := answerOf(t, errb); a.Kind != Started || a.ID != c.ID {
				t.Errorf("%s %q: answer %+v; want started %s", level, cmdline, a, c.ID)
			}
			if level == "wrapped" {
				got, err := os.ReadFile(filepath.Join(home, ".postern", "markers", c.ID, "command"))
				if err != nil || string(got) != cmdline {
					t.Errorf("marker command %q (%v); want %q", got, err, cmdline)
				}
			}
		}
	}
	// The exported value arrives intact.
	c := Command{ID: newID(t), Line: `printf %s "$X_VALUE"`, Export: map[string]string{"X_VALUE": "a'b\n$(c)"}}
	if out, _, _ := shell(t, home, wrapped(t, c), ""); out != "a'b\n$(c)" {
		t.Errorf("exported X_VALUE = %q", out)
	}
}

// TestWrapperRunsAnIDOnce: the same id twice runs once; the second answer is the recorded
// outcome, and status reports it.
func TestWrapperRunsAnIDOnce(t *testing.T) {
	home := install(t)
	effects := filepath.Join(home, "effects")
	c := Command{ID: newID(t), Line: "echo ran >> " + Quote(effects) + "; exit 7"}
	_, errb, code := shell(t, home, wrapped(t, c), "")
	if code != 7 || answerOf(t, errb).Kind != Started {
		t.Fatalf("first run: exit %d, stderr %q", code, errb)
	}
	_, errb, code = shell(t, home, wrapped(t, c), "")
	a := answerOf(t, errb)
	if code != 0 || a.Kind != Duplicate || a.State != Exited || a.Exit == nil || *a.Exit != 7 {
		t.Fatalf("second run: exit %d, answer %+v (%q)", code, a, errb)
	}
	if data, _ := os.ReadFile(effects); string(data) != "ran\n" {
		t.Fatalf("effects %q; want one run", data)
	}
	status, _ := StatusLine(c.ID, ScriptSHA256())
	out, _, _ := shell(t, home, status, "")
	if a := answerOf(t, out); a.Kind != Status || a.State != Exited || *a.Exit != 7 || a.RetentionDays != 30 {
		t.Fatalf("status %+v (%q)", a, out)
	}
	other, _ := StatusLine(newID(t), ScriptSHA256())
	out, _, _ = shell(t, home, other, "")
	if a := answerOf(t, out); a.State != Absent {
		t.Fatalf("status of an unknown id: %+v", a)
	}
	out, _, _ = shell(t, home, ListLine(ScriptSHA256()), "")
	if !strings.Contains(out, c.ID) {
		t.Fatalf("list %q lacks %s", out, c.ID)
	}
}

// TestWrapperRefusesBeforeTheClaim: what can be refused is refused without a marker, so the
// same id can still run.
func TestWrapperRefusesBeforeTheClaim(t *testing.T) {
	home := install(t)
	c := Command{ID: newID(t), Cwd: filepath.Join(home, "missing"), Line: "true"}
	_, errb, code := shell(t, home, wrapped(t, c), "")
	if a := answerOf(t, errb); code != 255 || a.Kind != Refused || a.Reason != "cwd" {
		t.Fatalf("exit %d answer %+v", code, a)
	}
	if _, err := os.Stat(filepath.Join(home, ".postern", "markers", c.ID)); !os.IsNotExist(err) {
		t.Fatalf("a refusal left a marker: %v", err)
	}
	// By hand, an id that is not canonical never reaches mkdir.
	for _, bad := range []string{"ex_../../x", "ex_01jdq0000000000000000000ab", "../ex_01JDQ0000000000000000000AB", "ex_01JDQ0000000000000000000A\nB"} {
		_, errb, _ := shell(t, home, "sh ~/.postern/run exec "+Quote(bad)+" '' 0 true", "")
		if a := answerOf(t, errb); a.Reason != "bad_id" {
			t.Errorf("id %q: %+v", bad, a)
		}
	}
	if _, err := PlainLine(Command{ID: "ex_bad'; rm -rf ~; '"}); !errors.Is(err, ErrBadID) {
		t.Errorf("PlainLine took a bad id: %v", err)
	}
}

func TestChangedWrapperIsRefused(t *testing.T) {
	home := install(t)
	run := filepath.Join(home, ".postern", "run")
	if err := os.WriteFile(run, []byte(Script+"\n# edited\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	c := Command{ID: newID(t), Line: "echo ran > " + Quote(filepath.Join(home, "effect"))}
	_, errb, code := shell(t, home, wrapped(t, c), "")
	if a := answerOf(t, errb); code != 255 || a.Reason != "script_changed" {
		t.Fatalf("exit %d answer %+v", code, a)
	}
	if _, err := os.Stat(filepath.Join(home, "effect")); !os.IsNotExist(err) {
		t.Fatal("the changed wrapper ran the command")
	}
	os.Remove(run)
	if _, errb, _ := shell(t, home, wrapped(t, c), ""); answerOf(t, errb).Reason != "script_missing" {
		t.Fatalf("missing wrapper: %q", errb)
	}
}

// TestWrapperStates: a live command is running; one whose wrapper was killed (-9) without an
// exit record is interrupted; a bare claim is claimed.
func TestWrapperStates(t *testing.T) {
	home := install(t)
	status := func(id string) Answer {
		l, _ := StatusLine(id, ScriptSHA256())
		out, _, _ := shell(t, home, l, "")
		return answerOf(t, out)
	}
	c := Command{ID: newID(t), Line: "sleep 30"}
	cmd := exec.Command("/bin/sh", "-c", wrapped(t, c))
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	started := filepath.Join(home, ".postern", "markers", c.ID, "started")
	testutil.WaitFor(t, "the started record", func() bool {
		_, err := os.Stat(started)
		return err == nil
	})
	if a := status(c.ID); a.State != Running {
		t.Fatalf("live command: %+v", a)
	}
	data, _ := os.ReadFile(started)
	pid, _ := strconv.Atoi(strings.Fields(string(data))[0])
	if pid != cmd.Process.Pid {
		t.Fatalf("started names pid %d; the wrapper is %d", pid, cmd.Process.Pid)
	}
	syscall.Kill(pid, syscall.SIGKILL) // the wrapper only: its sleep goes on, unrecorded
	cmd.Wait()
	if a := status(c.ID); a.State != Interrupted {
		t.Fatalf("killed wrapper: %+v", a)
	}
	claimed := newID(t)
	if err := os.Mkdir(filepath.Join(home, ".postern", "markers", claimed), 0o700); err != nil {
		t.Fatal(err)
	}
	if a := status(claimed); a.State != Claimed || a.Old {
		t.Fatalf("bare claim: %+v", a)
	}
	old := time.Now().Add(-10 * time.Minute)
	os.Chtimes(filepath.Join(home, ".postern", "markers", claimed), old, old)
	if a := status(claimed); a.State != Claimed || !a.Old {
		t.Fatalf("old claim: %+v", a)
	}
}

func TestFilterTakesOutTheAnswer(t *testing.T) {
	id := "ex_01JDQ0000000000000000000AB"
	for _, tc := range []struct {
		name, in, want string
		kind           Kind
	}{
		{"alone", Prefix + "started id=" + id + "\nerr\n", "err\n", Started},
		{"after rc output", "motd line\n" + Prefix + "started id=" + id + "\nerr", "motd line\nerr", Started},
		{"none", "just stderr\nmore", "just stderr\nmore", ""},
		{"not at line start", "x" + Prefix + "started\n", "x" + Prefix + "started\n", ""},
		{"a later one stays", Prefix + "started id=" + id + "\n" + Prefix + "refused reason=x\n", Prefix + "refused reason=x\n", Started},
	} {
		for _, step := range []int{1, 3, 1000} {
			var out bytes.Buffer
			var got Kind
			f := &Filter{W: &out, OnAnswer: func(a Answer, err error) { got = a.Kind }}
			for i := 0; i < len(tc.in); i += step {
				f.Write([]byte(tc.in[i:min(len(tc.in), i+step)]))
			}
			f.Close()
			if out.String() != tc.want || got != tc.kind {
				t.Errorf("%s (step %d): passed %q, answer %q; want %q, %q", tc.name, step, out.String(), got, tc.want, tc.kind)
			}
		}
	}
}

// TestFilterSaysWhenAnAnswerMayHaveBeenMissed: stderr that holds the answer prefix where the
// filter does not take an answer (not at a line start: a start-up file printed without a
// newline), an answer line that does not parse, or more start-up output than the filter scans
// may have hidden the answer; Unreadable says so, whatever the chunking, so that an exit
// status without an answer is not taken for "never started".
func TestFilterSaysWhenAnAnswerMayHaveBeenMissed(t *testing.T) {
	id := "ex_01JDQ0000000000000000000AB"
	for _, tc := range []struct {
		name, in   string
		unreadable bool
	}{
		{"answer", "motd\n" + Prefix + "started id=" + id + "\nerr", false},
		{"no prefix at all", "This account is currently not available.\n", false},
		{"prefix mid-line", "no newline from .bashrc" + Prefix + "started id=" + id + "\nerr\n", true},
		{"bad answer line", Prefix + "started id=bogus\n", true},
		{"too much start-up output", strings.Repeat("x\n", maxScanBytes) + Prefix + "started id=" + id + "\n", true},
	} {
		for _, step := range []int{1, 5, 1 << 20} {
			f := &Filter{W: &bytes.Buffer{}}
			for i := 0; i < len(tc.in); i += step {
				f.Write([]byte(tc.in[i:min(len(tc.in), i+step)]))
			}
			f.Close()
			if got := f.Unreadable(); got != tc.unreadable {
				t.Errorf("%s (step %d): Unreadable() = %v; want %v", tc.name, step, got, tc.unreadable)
			}
		}
	}
}

// TestScriptPassesShellcheck: the wrapper is POSIX sh without bashisms, as shellcheck -s sh
// judges it (skipped where shellcheck is not installed: apt-get install shellcheck).
func TestScriptPassesShellcheck(t *testing.T) {
	path, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Skip("shellcheck not installed")
	}
	if out, err := exec.Command(path, "-s", "sh", "run.sh").CombinedOutput(); err != nil {
		t.Fatalf("shellcheck: %v\n%s", err, out)
	}
}

func TestLineIsBounded(t *testing.T) {
	c := Command{ID: newID(t), Line: strings.Repeat("'", MaxLineBytes/4)}
	if _, err := PlainLine(c); !errors.Is(err, ErrTooLong) {
		t.Fatalf("a command of %d quotes: %v; want ErrTooLong", len(c.Line), err)
	}
	c.Line = strings.Repeat("x", MaxLineBytes/2)
	if _, err := WrappedLine(c, ScriptSHA256()); err != nil {
		t.Fatalf("a command of %d bytes: %v", len(c.Line), err)
	}
	if _, err := PlainLine(Command{ID: c.ID, Line: "true", Export: map[string]string{"BAD NAME": "x"}}); err == nil {
		t.Fatal("an invalid variable name reached the line")
	}
}

// TestWrapperPrunesOnlyOldFinishedMarkers: finished markers past the retention go, at most
// once a day; a marker without an exit record stays whatever its age.
func TestWrapperPrunesOnlyOldFinishedMarkers(t *testing.T) {
	home := install(t)
	dir := filepath.Join(home, ".postern", "markers")
	old := time.Now().Add(-31 * 24 * time.Hour)
	finished, unfinished := newID(t), newID(t)
	for _, id := range []string{finished, unfinished} {
		if err := os.MkdirAll(filepath.Join(dir, id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	exit := filepath.Join(dir, finished, "exit")
	if err := os.WriteFile(exit, []byte("0 then\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(exit, old, old)
	os.Chtimes(filepath.Join(dir, unfinished), old, old)
	if _, errb, code := shell(t, home, wrapped(t, Command{ID: newID(t), Line: "true"}), ""); code != 0 {
		t.Fatalf("exec: exit %d %q", code, errb)
	}
	if _, err := os.Stat(filepath.Join(dir, finished)); !os.IsNotExist(err) {
		t.Errorf("the finished marker past the retention is still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, unfinished)); err != nil {
		t.Errorf("the marker without an exit record was pruned: %v", err)
	}
}

// TestCommandKeepsTheAccountsUmaskAndLocale: the wrapper's private umask and byte-wise
// locale are its own; the command runs with what the account's shell had, as at level none.
func TestCommandKeepsTheAccountsUmaskAndLocale(t *testing.T) {
	home := install(t)
	for _, export := range []map[string]string{nil, {"LC_ALL": "POSIX"}} {
		c := Command{ID: newID(t), Line: `umask; echo "${LC_ALL-unset}"`, Export: export}
		plain, err := PlainLine(c)
		if err != nil {
			t.Fatal(err)
		}
		want, _, _ := shell(t, home, plain, "")
		got, errb, _ := shell(t, home, wrapped(t, c), "")
		if got != want {
			t.Errorf("export %v: under the wrapper %q; at level none %q (stderr %q)", export, got, want, errb)
		}
	}
	info, err := os.Stat(filepath.Join(home, ".postern", "markers"))
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(home, ".postern", "markers"))
	for _, e := range entries {
		fi, _ := e.Info()
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("marker %s: mode %v; want 0700", e.Name(), fi.Mode().Perm())
		}
	}
	if info.Mode().Perm() != 0o700 {
		t.Errorf("markers dir: mode %v", info.Mode().Perm())
	}
}

// FuzzFilter: whatever a host writes to stderr, in whatever chunks, the filter passes every
// byte on except one answer line at the start of a line, which it reports.
func FuzzFilter(f *testing.F) {
	f.Add([]byte("motd\n"+Prefix+"started id=ex_01JDQ0000000000000000000AB\nerr"), uint8(3))
	f.Add([]byte(Prefix), uint8(1))
	f.Add([]byte("x"+Prefix+"refused reason=cwd\n"), uint8(7))
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		n := int(step%16) + 1
		var out bytes.Buffer
		var answers int
		var line string
		fl := &Filter{W: &out, OnAnswer: func(Answer, error) { answers++ }}
		for i := 0; i < len(in); i += n {
			fl.Write(in[i:min(len(in), i+n)])
		}
		fl.Close()
		if answers > 1 {
			t.Fatalf("%d answers reported", answers)
		}
		if answers == 0 {
			if !bytes.Equal(out.Bytes(), in) {
				t.Fatalf("no answer, yet the output %q differs from the input %q", out.Bytes(), in)
			}
			return
		}
		// Exactly one line starting with Prefix was taken out.
		removed := len(in) - out.Len()
		for _, l := range bytes.SplitAfter(in, []byte("\n")) {
			if bytes.HasPrefix(l, []byte(Prefix)) && len(l) == removed && l[len(l)-1] == '\n' {
				line = string(l)
			}
		}
		if line == "" {
			t.Fatalf("the answer taken out is no line of the input: in %q out %q", in, out.Bytes())
		}
	})
}
