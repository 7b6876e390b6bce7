package main

// The processes8 scenario runs its contenders in helper processes: this
// binary started again with roleVar set, which main (or TestMain, in the
// smoke test's binary) checks first thing. A helper opens its own clients
// of the server in addrVar, one per library in libsVar, says it is ready,
// and then runs each roundSpec it reads on stdin with runLocal, answering
// with the localResult, one JSON line each way, until its stdin closes.
// internal/helperproc does the same for test binaries only (it needs a
// testing.TB); this is the few lines a plain main needs.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Environment of a helper process.
const (
	roleVar    = "DISTLOCK_BENCH_ROLE"
	addrVar    = "DISTLOCK_BENCH_ADDR"
	libsVar    = "DISTLOCK_BENCH_HELPER_LIBS"
	profileVar = "DISTLOCK_BENCH_HELPER_CPUPROFILE" // the helper's CPU profile, if set
	roleWorker = "worker"
)

// helperTimeout bounds a helper's start (its clients connect) and its exit.
const helperTimeout = 30 * time.Second

// helperReply is a line from a helper: ready, a round's result, or the
// error that ends it.
type helperReply struct {
	Ready  bool         `json:"ready,omitempty"`
	Result *localResult `json:"result,omitempty"`
	Err    string       `json:"err,omitempty"`
}

// helper is a running helper process.
type helper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	enc *json.Encoder
	dec *json.Decoder
}

// startHelpers starts n helpers with the libraries names for the server at
// addr and waits until each is ready; if profile is not empty, helper i
// writes its CPU profile to profile.i. On an error it stops those it
// started.
func startHelpers(n int, addr string, names []string, profile string) ([]*helper, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var hs []*helper
	fail := func(err error) ([]*helper, error) {
		for _, h := range hs {
			h.kill()
		}
		return nil, err
	}
	for i := range n {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), roleVar+"="+roleWorker, addrVar+"="+addr, libsVar+"="+strings.Join(names, ","))
		if profile != "" {
			cmd.Env = append(cmd.Env, profileVar+"="+profile+"."+strconv.Itoa(i))
		}
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the benchmark
		in, err := cmd.StdinPipe()
		if err != nil {
			return fail(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err)
		}
		if err := cmd.Start(); err != nil {
			return fail(err)
		}
		// cmd.Wait closes out: only stop and kill call it, once every
		// reply has been read.
		hs = append(hs, &helper{cmd: cmd, in: in, enc: json.NewEncoder(in), dec: json.NewDecoder(out)})
	}
	for _, h := range hs {
		var r helperReply
		if err := h.recv(&r); err != nil {
			return fail(err)
		}
		if !r.Ready {
			return fail(fmt.Errorf("helper %d: %s", h.cmd.Process.Pid, r.Err))
		}
	}
	return hs, nil
}

// recv reads the helper's next line, giving up after helperTimeout past
// the round's end at the latest (drainTimeout bounds a helper's round).
func (h *helper) recv(r *helperReply) error {
	got := make(chan error, 1) // the decoder may finish after we gave up
	go func() { got <- h.dec.Decode(r) }()
	select {
	case err := <-got:
		if err != nil {
			return fmt.Errorf("helper %d: %w", h.cmd.Process.Pid, err)
		}
		return nil
	case <-time.After(drainTimeout + helperTimeout):
		return fmt.Errorf("helper %d: no reply in %v", h.cmd.Process.Pid, drainTimeout+helperTimeout)
	}
}

// send has the helper run spec; result returns what it measured.
func (h *helper) send(spec roundSpec) error {
	if err := h.enc.Encode(spec); err != nil {
		return fmt.Errorf("helper %d: %w", h.cmd.Process.Pid, err)
	}
	return nil
}

func (h *helper) result() (localResult, error) {
	var r helperReply
	if err := h.recv(&r); err != nil {
		return localResult{}, err
	}
	if r.Result == nil {
		return localResult{}, fmt.Errorf("helper %d: %s", h.cmd.Process.Pid, r.Err)
	}
	return *r.Result, nil
}

// stop closes the helper's stdin and waits for it to exit with status 0;
// it kills a helper that does not exit in helperTimeout.
func (h *helper) stop() error {
	_ = h.in.Close()
	exited := make(chan error, 1)
	go func() { exited <- h.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("helper %d: %w", h.cmd.Process.Pid, err)
		}
		return nil
	case <-time.After(helperTimeout):
		_ = h.cmd.Process.Kill()
		<-exited
		return fmt.Errorf("helper %d: did not exit in %v", h.cmd.Process.Pid, helperTimeout)
	}
}

func (h *helper) kill() {
	_ = h.cmd.Process.Kill()
	_ = h.cmd.Wait()
}

// stopHelpers stops every helper and returns the first error.
func stopHelpers(hs []*helper) error {
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.stop())
	}
	return errors.Join(errs...)
}

// runHelper is the main of a helper process.
func runHelper(role string) int {
	if role != roleWorker {
		fmt.Fprintf(os.Stderr, "benchmarks: unknown helper role %q\n", role)
		return 2
	}
	enc, dec := json.NewEncoder(os.Stdout), json.NewDecoder(os.Stdin)
	stop, err := startCPUProfile(os.Getenv(profileVar))
	if err != nil {
		_ = enc.Encode(helperReply{Err: err.Error()})
		return 1
	}
	defer stop()
	libs, err := openLibraries(os.Getenv(addrVar), strings.Split(os.Getenv(libsVar), ","))
	if err != nil {
		_ = enc.Encode(helperReply{Err: err.Error()})
		return 1
	}
	defer closeLibraries(libs)
	if err := enc.Encode(helperReply{Ready: true}); err != nil {
		return 1
	}
	for {
		var spec roundSpec
		if err := dec.Decode(&spec); err != nil {
			if errors.Is(err, io.EOF) {
				return 0
			}
			fmt.Fprintln(os.Stderr, "benchmarks helper:", err)
			return 1
		}
		reply := helperReply{Err: fmt.Sprintf("library %q is not open", spec.Lib)}
		if lib := libs[spec.Lib]; lib != nil {
			res := runLocal(lib, spec)
			reply = helperReply{Result: &res}
		}
		if err := enc.Encode(reply); err != nil {
			return 1
		}
	}
}
