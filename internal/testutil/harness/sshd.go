package harness

import (
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// sshdPath is Debian's OpenSSH server, the baseline the bastion benchmarks compare with.
const sshdPath = "/usr/sbin/sshd"

// privsepDir is the directory sshd chroots its unprivileged child into; Debian's service unit
// creates it at start (RuntimeDirectory=sshd), so a machine where sshd never ran as a
// service lacks it.
const privsepDir = "/run/sshd"

// SSHD is a real OpenSSH server on 127.0.0.1, in the foreground, with its own host key and
// one authorized client key for the current user; it is killed at cleanup.
//
// Its sessions get an empty temporary HOME: Debian's bash sources ~/.bashrc for commands
// run over ssh (it sees SSH_CLIENT), and an account's rc files (pyenv, nvm, …) can cost more
// than the whole SSH round trip. The hostagent runs commands without them, so a baseline
// that read them would measure the account's dotfiles, not OpenSSH.
type SSHD struct {
	Addr, Port, Account string
	HostKey             gossh.PublicKey
	ClientKey           testutil.SSHKey
	// KnownHosts pins HostKey for Addr; Identity is ClientKey's private key file.
	KnownHosts, Identity string

	logs testutil.LockedBuffer // sshd's stdout and stderr
}

// StartSSHD starts /usr/sbin/sshd -D -e with a config in a temp dir and waits until it
// answers with its SSH banner. It skips the test when sshd is not installed or cannot run
// (it needs root for privilege separation).
func StartSSHD(t testing.TB) *SSHD { t.Helper(); return StartSSHDWith(t, SSHDOptions{}) }

// SSHDOptions adjust StartSSHDWith.
type SSHDOptions struct {
	// Account, if set, is a local account with a home (unixuser.NewLogin) that logs in
	// instead of the current user, as on a real host: with its own HOME and its own
	// ~/.ssh/authorized_keys (ClientKey and AuthorizedKeys), read by sshd as that user.
	Account, Home string
	UID, GID      int
	// AuthorizedKeys are more authorized_keys lines besides ClientKey's (a bastion's key).
	AuthorizedKeys []string
	// TrustedUserCAKeys, if set, is the file sshd's TrustedUserCAKeys names (a bastion CA's
	// lines): sshd reads it at each login, so a test may write it later.
	TrustedUserCAKeys string
}

// StartSSHDWith is StartSSHD with opts.
func StartSSHDWith(t testing.TB, opts SSHDOptions) *SSHD {
	t.Helper()
	if _, err := os.Stat(sshdPath); err != nil {
		t.Skipf("OpenSSH server not installed (%s: %v); apt-get install openssh-server to run this baseline", sshdPath, err)
	}
	if os.Geteuid() != 0 {
		t.Skipf("sshd needs root for privilege separation; running as uid %d", os.Geteuid())
	}
	if err := os.MkdirAll(privsepDir, 0o755); err != nil {
		t.Skipf("sshd privilege separation dir %s: %v", privsepDir, err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hostKey, clientKey := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	s := &SSHD{Addr: testutil.FreeAddr(t), Account: u.Username, HostKey: hostKey.Public(), ClientKey: clientKey}
	if opts.Account != "" {
		s.Account = opts.Account
	}
	_, s.Port, _ = net.SplitHostPort(s.Addr)
	hostKeyPath := hostKey.WritePrivateKey(t, filepath.Join(dir, "ssh_host_ed25519_key"))
	s.Identity = clientKey.WritePrivateKey(t, filepath.Join(dir, "id_ed25519"))
	s.KnownHosts = testutil.WriteKnownHosts(t, filepath.Join(dir, "known_hosts"), s.Addr, s.HostKey)
	authorizedLines := append([]string{clientKey.AuthorizedLine()}, opts.AuthorizedKeys...)
	authorized := filepath.Join(dir, "authorized_keys")
	var setHome string
	if opts.Account == "" {
		home := filepath.Join(dir, "home")
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		setHome = "SetEnv HOME=" + home
		testutil.WriteAuthorizedKeys(t, authorized, authorizedLines...)
	} else {
		authorized = "%h/.ssh/authorized_keys"
		sshDir := filepath.Join(opts.Home, ".ssh")
		if err := os.MkdirAll(sshDir, 0o700); err != nil {
			t.Fatal(err)
		}
		testutil.WriteAuthorizedKeys(t, filepath.Join(sshDir, "authorized_keys"), authorizedLines...)
		for _, p := range []string{sshDir, filepath.Join(sshDir, "authorized_keys")} {
			if err := os.Chown(p, opts.UID, opts.GID); err != nil {
				t.Fatal(err)
			}
		}
	}
	var trustedCAs string
	if opts.TrustedUserCAKeys != "" {
		trustedCAs = "TrustedUserCAKeys " + opts.TrustedUserCAKeys
	}
	config := filepath.Join(dir, "sshd_config")
	lines := []string{
		"ListenAddress 127.0.0.1",
		"Port " + s.Port,
		"HostKey " + hostKeyPath,
		"AuthorizedKeysFile " + authorized,
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"UsePAM no",
		"StrictModes no",
		"PermitRootLogin prohibit-password",
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"UseDNS no",
		"LogLevel ERROR",
		setHome,
		trustedCAs,
		// Enough for many multiplexed sessions at once (default 10).
		"MaxSessions 100",
		"MaxStartups 100",
	}
	if err := os.WriteFile(config, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sshdPath, "-D", "-e", "-f", config)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = &s.logs, &s.logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sshd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	})
	deadline := time.Now().Add(60 * time.Second)
	for !s.answers() {
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			t.Fatalf("sshd exited before it served: %v\n%s", err, s.Logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd did not answer on %s\n%s", s.Addr, s.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// answers reports whether sshd accepted a connection and sent its version banner.
func (s *SSHD) answers() bool {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	banner := make([]byte, 4)
	_, err = c.Read(banner)
	return err == nil && string(banner) == "SSH-"
}

// Logs is what sshd wrote to stderr.
func (s *SSHD) Logs() string {
	return s.logs.String()
}

// Multiplexed starts an OpenSSH control master to the server and returns the ssh(1)
// arguments of a client that rides on it, ending with the destination: append the command.
// The master is closed (ssh -O exit) at cleanup.
func (s *SSHD) Multiplexed(t testing.TB) []string {
	t.Helper()
	cmDir := sockdir.New(t) // holds the control master's socket
	args := append(testutil.OpenSSHArgs(s.KnownHosts, s.Identity, s.Port),
		"-o", "ControlMaster=auto",
		"-o", "ControlPath="+filepath.Join(cmDir, "m"),
		"-o", "ControlPersist=60",
		s.Account+"@127.0.0.1",
	)
	// -f backgrounds the master once it is authenticated; its stdio are files, so Run does
	// not wait for the daemonized master to close a pipe.
	errFile, err := os.Create(filepath.Join(cmDir, "master.err"))
	if err != nil {
		t.Fatal(err)
	}
	defer errFile.Close()
	master := exec.Command("ssh", append([]string{"-M", "-N", "-f"}, args...)...)
	master.Stdout, master.Stderr = errFile, errFile
	if err := master.Run(); err != nil {
		out, _ := os.ReadFile(errFile.Name())
		t.Fatalf("ssh control master: %v\n%s\nsshd: %s", err, out, s.Logs())
	}
	t.Cleanup(func() {
		exit := exec.Command("ssh", append([]string{"-O", "exit"}, args...)...)
		if out, err := exit.CombinedOutput(); err != nil {
			t.Logf("ssh -O exit: %v\n%s", err, out)
		}
	})
	if out, err := exec.Command("ssh", append(args, "true")...).CombinedOutput(); err != nil {
		t.Fatalf("ssh through the control master: %v\n%s\nsshd: %s", err, out, s.Logs())
	}
	return args
}
