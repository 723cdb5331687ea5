#!/usr/bin/env python3
"""supervise.py — run a training job and restart it after a crash or a hang.

    scripts/supervise.py [--retries N] [--stale-s S] [--startup-s S] [--heartbeat FILE]
                         [--recovery-log FILE.jsonl] [--spare 0|1] -- CMD ARGS...

    scripts/supervise.py --recovery-log out/d12/recovery.jsonl -- \\
        ./train_gpt --model d12 ... --output-dir out/d12 --save-every 200
    scripts/supervise.py -- mpirun --mca odls_base_sigkill_timeout 0 -np 2 ./train_gpt_mpi ... \
        --output-dir out/d12 --save-every 200

CMD must take train_gpt's flags at its end (train_gpt, or mpirun/srun around
train_gpt_mpi): the supervisor appends `--resume 1 --heartbeat FILE`, so the
first attempt starts fresh (or continues whatever state --output-dir holds)
and every restart continues, bit for bit, from the newest state the trainer
can find (its memory snapshots with --snapshot-every, else the newest
complete state on disk). Without --output-dir in CMD a restart would start
again from step 0. (odls_base_sigkill_timeout 0: when a rank dies, Open
MPI's mpirun kills the others at once instead of waiting 1 s, which the
recovery would otherwise spend; the supervisor passes it to mpirun in the
environment when the command does not give it: OPEN_MPI_LAUNCHERS.)

What it does, attempt after attempt:
  - runs CMD in a session of its own (setsid), with GPTC_RUN_ID (unique per
    attempt: the trainer's rendezvous uses it to tell this launch from a
    stale one) and GPTC_ATTEMPT (1, 2, ...) in its environment;
  - passes the child's stdout and stderr through unchanged, and reads the
    trainer's `timing:` and `resume:` lines on the way;
  - calls an attempt failed when it exits non-zero or dies by a signal, or
    when it hangs: the heartbeat file (rank 0 rewrites it after every step)
    does not change for --stale-s seconds, or does not appear within
    --startup-s seconds of the launch. A hung attempt's processes, every one
    in its session (mpirun puts each rank in a process group of its own, so
    the group is not enough), get SIGTERM and SIGCONT (a stopped process
    cannot act on SIGTERM), then SIGKILL after KILL_GRACE_S seconds; so do
    any left behind by an attempt that exited;
  - relaunches, and logs how the recovery spent its time (below);
  - exits 0 when an attempt exits 0; 1 when --retries restarts in a row made
    no progress; 128+N after signal N (SIGINT, SIGTERM: forwarded to the
    child's process group, then the child's session is cleaned up; no
    restart); 2 for a usage error.

Retries count consecutive failures without progress: an attempt made
progress when it finished a step beyond the furthest step any attempt
before it reached (as the heartbeat tells). So a week-long job survives any
number of failures that are far apart, while a job that crashes at the same
place every time, or cannot start at all, gives up after --retries restarts.

The recovery log. For each restart, a line on stdout, prefixed
"supervisor:", and a JSON record (one line) appended to --recovery-log:
    detected     the failure was seen (unix ms: exit reaped, or the heartbeat went stale)
    relaunch     detected -> the new attempt spawned (cleaning up the old one)
    launch       spawned -> the trainer's process start (`timing: ... since process start T`; with mpirun, its start-up)
    comm init    process start -> communicator ready (MPI_Init)
    model setup  communicator ready -> model ready (the model built, the snapshot memory mapped)
    state load   model ready -> state loaded (--resume finds the freshest usable state and reads it)
    first step   state loaded -> first step done
    total        detected -> first step done
plus the step it resumed from and where the state came from (the trainer's
`resume: continuing after step N; ...` line), the last step done before the
failure (from the heartbeat and the trainer's printed `step N/M` lines), and
the steps lost (their difference: work done again). The first attempt gets
the same record (event "start", from spawn) for comparison. An attempt that
fails again before its first step has a record with the phases it reached
(outcome "failed before its first step"). The times are wall clocks of this
machine and of rank 0's: across machines, clock skew enters "launch".

A hot spare (--spare 1; issue 17). Once an attempt has done its first
step, the supervisor starts one more trainer, the same command with
`--standby FIFO` (a FIFO of its own in a temporary folder): it builds the
model, faults in its memory, opens the tokenizer and data, maps the
snapshot slots (reading them only), prints `standby: ready`, and waits on
the FIFO without taking the run's locks. When the active attempt fails and
the spare is ready, the supervisor ends what is left of the failed attempt
(so its locks are free), writes `go` into the FIFO, and watches the spare as
the next attempt: it takes the locks, loads the newest snapshot from memory
(or disk, or starts at step 0 when there is none: the trainer's usual
rules) and continues bit for bit; its recovery record splits the time into
promote (detected -> `go` written), wake (-> the locks taken: "model
ready"), state load and first step. A new spare starts once the promoted
one has done its first step. A spare that is not ready yet when the active
attempt fails (two failures closer together than a spare's set-up) is
killed and the command relaunched cold, as without --spare; a spare that
dies while it waits is replaced (after 3 such deaths in a row the
supervisor stops making spares and says so). At the end the spare is
dismissed (its FIFO closed: it exits 0, having written nothing).
One trainer process with a ready spare is looked at every 20 ms: once it is
seen exiting after a failure (PF_EXITING and a non-zero exit code in
/proc/PID/stat), the spare is promoted at once, before the kernel has freed
the dead trainer's memory and dropped its locks (1-2 s for GPT-2 124M here);
the spare inherits those locks (gptc/state.h's RunLock) and the dead one is
cleaned up behind it. With an mpirun command the spare is a whole standby
job, a second `mpirun -np N` with `--standby FIFO` (rank 0 reads the FIFO,
the other ranks wait for its word): Open MPI cannot put a new process in
one dead rank's place, so when any rank dies, mpirun ends the rest, and the
standby job is promoted once mpirun has exited (README, "A hot spare";
with --mca odls_base_sigkill_timeout 0, 9-17 ms after a rank's SIGKILL
here). Under srun the standby job is a second job step of the same
allocation, `srun --overlap` (standby_command); srun --kill-on-bad-exit=1
ends the active step when a rank dies.

Left out on purpose: backoff between restarts, e-mail/alerts, replacing a
dead node (under Slurm that is the job's business: see
scripts/slurm_supervised.sbatch), and any reading of the trainer's state
files (the trainer picks the state; the supervisor only restarts it).
"""
import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

POLL_S = 0.1        # how often the heartbeat is looked at
SPARE_POLL_S = 0.02 # how often one trainer with a ready spare is looked at (is it exiting?)
MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun", "srun")
# Open MPI's launchers: when a rank dies, mpirun ends the others after
# odls_base_sigkill_timeout, 1 s by default (measured here: mpirun exited
# 1.0 s after a rank's SIGKILL, 9-20 ms with 0). The supervisor passes 0 in
# the environment (OMPI_MCA_odls_base_sigkill_timeout) unless the command
# or the environment sets it: a failure is noticed, and a spare promoted,
# 1 s sooner.
OPEN_MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun")
KILL_GRACE_S = 5.0  # SIGTERM -> SIGKILL for the processes of a failed attempt
READER_JOIN_S = 2.0 # wait this long for the child's output to drain after it ended

# ---------------------------------------------------------------------------
# Output: the child's lines and ours, never interleaved mid-line
# ---------------------------------------------------------------------------
_print_lock = threading.Lock()


def say(message):
    """A supervisor line on stdout."""
    with _print_lock:
        sys.stdout.write(f"supervisor: {message}\n")
        sys.stdout.flush()


def wall_ms():
    return time.time() * 1000.0


def signal_name(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------
def options_parse(argv):
    """Options before `--`, the command after it."""
    parser = argparse.ArgumentParser(
        prog="scripts/supervise.py",
        usage="%(prog)s [options] -- CMD ARGS...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n", 1)[1],  # the header above, all of it: one text, no drift
        epilog="Exit status: 0 when an attempt exits 0; 1 when the retries are exhausted; 128+N after signal N "
               "(SIGINT/SIGTERM are forwarded to the job, which is not restarted); 2 for a usage error. The child "
               "gets GPTC_RUN_ID (unique per attempt) and GPTC_ATTEMPT (1, 2, ...) in its environment.")
    parser.add_argument("--retries", type=int, default=5, metavar="N",
                        help="give up after N restarts in a row that made no progress, i.e. did not get past the "
                             "furthest step reached before (the count starts again after progress); 0 = never "
                             "restart [5]")
    parser.add_argument("--stale-s", type=float, default=120.0, metavar="S",
                        help="a running attempt whose heartbeat has not changed for S seconds hangs: kill and "
                             "restart it. Make it longer than the slowest step plus evaluation, sampling and "
                             "checkpoint writing [120]")
    parser.add_argument("--startup-s", type=float, default=600.0, metavar="S",
                        help="allow S seconds from the launch to the first heartbeat (start-up, tokenizing --data "
                             "the first time, loading the state) [600]")
    parser.add_argument("--heartbeat", default="", metavar="FILE",
                        help="heartbeat file passed to the trainer; it must be visible here (rank 0 writes it); "
                             "[a file in a temporary directory, removed at exit]")
    parser.add_argument("--spare", type=int, default=0, metavar="N",
                        help="keep N standby trainers (0 or 1) set up and waiting (`--standby FIFO`), promoted at "
                             "once when the active trainer fails (one process, or a whole standby job under mpirun "
                             "or srun) [0]")
    parser.add_argument("--recovery-log", default="", metavar="FILE.jsonl",
                        help="append one JSON record per (re)start, and one at the end; empty = none [\"\"]")
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])  # --help prints and exits here
    args.command = argv[split + 1:]
    if not args.command:
        parser.error("no command: put it after `--`, e.g. scripts/supervise.py -- ./train_gpt "
                     "--output-dir out/run --save-every 100")
    if args.spare not in (0, 1):
        parser.error("--spare must be 0 or 1")
    if args.retries < 0 or args.stale_s <= 0 or args.startup_s <= 0:
        parser.error("--retries must be >= 0, --stale-s and --startup-s > 0")
    for flag in ("--heartbeat", "--resume", "--standby"):
        if flag in args.command:
            parser.error(f"the command has {flag}: leave it out, the supervisor appends --resume 1 --heartbeat FILE")
    if not any(a in ("--output-dir", "-o") for a in args.command):
        say("warning: no --output-dir (-o) in the command: nothing is saved, so a restart starts from step 0")
    return args


# ---------------------------------------------------------------------------
# Processes: a child in its own session, and everything in that session
# ---------------------------------------------------------------------------
def proc_table():
    """{pid: (ppid, session, state)} for every process, from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(name)] = (int(fields[1]), int(fields[3]), fields[0])
    return table


def session_members(sid):
    """Live (not zombie) processes of session `sid`, and their descendants
    wherever they went (a process that called setsid, a daemonised helper)."""
    table = proc_table()
    members = {pid for pid, (_, session, _) in table.items() if session == sid or pid == sid}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _, _) in table.items() if ppid in members} - members
        members |= children
        grew = bool(children)
    return {pid for pid in members if pid in table and table[pid][2] != "Z"}


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def session_kill(proc, why):
    """End every process of the child's session: SIGTERM (and SIGCONT, so a
    stopped one can act on it), then SIGKILL after KILL_GRACE_S. Reaps the
    child. Says how many processes it had to kill, if any."""
    pids = session_members(proc.pid) - {os.getpid()}
    if proc.poll() is None:
        pids.add(proc.pid)
    if not pids:
        return
    say(f"{why}: SIGTERM to {len(pids)} process(es) {sorted(pids)}")
    signal_all(pids, signal.SIGTERM)
    signal_all(pids, signal.SIGCONT)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        proc.poll()  # reap the child, or it stays a zombie that looks alive
        pids = session_members(proc.pid) - {os.getpid()}
        if not pids:
            return
        time.sleep(0.05)
    say(f"{why}: SIGKILL to {sorted(pids)} (still there {KILL_GRACE_S:.0f} s after SIGTERM)")
    signal_all(pids, signal.SIGKILL)
    proc.wait()


def exit_code_if_dying(pid):
    """A process being torn down after a failure: its exit code (the
    kernel's: signal in the low 7 bits, else status << 8), read from
    /proc/PID/stat while PF_EXITING is set and before it is reaped. None
    while it runs, once it is gone, or when it exits with status 0. The
    kernel frees a process's memory before it closes its files (drops its
    locks) and before it becomes a zombie: for a GPT-2 124M trainer that is
    0.3-1 s here, which a hot spare need not wait for (issue 17)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if len(fields) < 50 or not int(fields[6]) & 0x4:  # flags: PF_EXITING
        return None
    code = int(fields[49])  # exit_code (field 52)
    return code or None


def code_words(code):
    return f"killed by signal {code & 0x7f} ({signal_name(code & 0x7f)})" if code & 0x7f else f"exit status {code >> 8}"


class ExitWaiter:
    """Sleep until the child exits or the timeout passes: a pidfd wakes us
    at once on exit (Linux 5.3+); without one, poll."""

    def __init__(self, proc):
        self.proc = proc
        try:
            self.fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self.fd = None

    def wait(self, timeout):
        if self.fd is not None:
            select.select([self.fd], [], [], timeout)
        else:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.proc.poll()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---------------------------------------------------------------------------
# The child's output: pass it through, and read the trainer's timing lines
# ---------------------------------------------------------------------------
TIMING_RE = re.compile(r"^timing: (.+?) at (\d+) \(\+-?\d+ ms since process start (\d+)\)")
RESUME_RE = re.compile(r"^resume: continuing after step (\d+)[;:,]? *(.*)")  # the rest: where each rank's state came from
STEP_RE = re.compile(r"^step +(\d+)/\d+ \|")  # printed after each step, N = steps done
FRESH_RE = re.compile(r"^resume: .*starting (?:from|at) step (\d+)")


def output_pump(stream, sink, attempt, parse):
    """Copy the child's lines to our stdout or stderr as they come; from
    stdout, note the timing and resume lines in `attempt`."""
    for raw in iter(stream.readline, b""):
        with _print_lock:
            sink.write(b"[spare] " + raw if attempt.standby else raw)  # a waiting spare's lines, told apart
            sink.flush()
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if re.search(r"[A-Za-z0-9]", line):  # not blank, not one of mpirun's ---- rules
            attempt.tail = (attempt.tail + [line])[-3:]
        if not parse:
            continue
        m = TIMING_RE.match(line)
        if m:
            attempt.at.setdefault("process_start", float(m.group(3)))
            attempt.at.setdefault({"communicator ready": "comm_ready", "model ready": "model_ready",
                                   "state loaded": "state_loaded", "first step done": "first_step",
                                   "standby ready": "standby_ready"}.get(m.group(1), m.group(1)),
                                  float(m.group(2)))
        m = STEP_RE.match(line)
        if m:
            attempt.step_seen(int(m.group(1)), heartbeat=False)
            continue
        m = RESUME_RE.match(line)
        if m:
            attempt.resumed_from, attempt.resumed_how = int(m.group(1)), m.group(2).strip()
            continue
        m = FRESH_RE.match(line)
        if m:
            attempt.resumed_from, attempt.resumed_how = int(m.group(1)), "fresh start"
    stream.close()


# ---------------------------------------------------------------------------
# The heartbeat: "step N <unix ms>", rewritten by rank 0 after every step
# ---------------------------------------------------------------------------
def heartbeat_read(path):
    """(signature, step) of the heartbeat file, or (None, None) when there
    is none. The signature (content, mtime) changes with every rewrite."""
    try:
        with open(path) as f:
            text = f.read()
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return None, None
    m = re.match(r"step (\d+) ", text)
    return (text, mtime), (int(m.group(1)) if m else None)


# ---------------------------------------------------------------------------
# One attempt
# ---------------------------------------------------------------------------
class Attempt:
    """What one launch of the command did."""

    def __init__(self, n, run_id):
        self.n = n
        self.run_id = run_id
        self.at = {}               # unix ms: spawned, process_start, comm_ready, state_loaded, first_step
        self.resumed_from = None   # from the trainer's resume: line
        self.resumed_how = ""      # and where the state came from (memory, a replica, disk), as it says
        self.first_step = None     # the heartbeat's first step (where it started)
        self.last_step = None      # the latest step done: heartbeat, or the trainer's "step N/M" line
        self.step_before = None    # the last step any heartbeat showed before this attempt
        self.tail = []             # the last lines it printed
        self.status = None         # "ok", "failed", "hang", "stopped"
        self.reason = ""           # how it failed, in words
        self.detected = None       # unix ms the failure was seen
        self.signal = None         # for "stopped": the signal that stopped us
        self.standby = False       # a spare still waiting (its lines are prefixed "[spare] ")
        self.spare = False         # started as a spare (promoted or not)
        self.fifo = None           # a spare's FIFO: (path, our descriptor)
        self.next = None           # the spare promoted while this attempt was still exiting
        self.proc = None
        self.pumps = []
        self.lock = threading.Lock()

    def step_seen(self, step, heartbeat):
        """Note a step done, from the heartbeat or from a printed step line.
        Both are looked at: the heartbeat is polled (steps can pass between
        two looks) and can be read empty (the trainer truncates, then
        writes), while every printed line reaches us."""
        with self.lock:  # called from the main thread and the stdout pump
            if heartbeat and self.first_step is None:
                self.first_step = step
            self.last_step = step if self.last_step is None else max(self.last_step, step)

    def started_at(self):
        """The step this attempt started from: its first heartbeat, or its resume line."""
        return self.first_step if self.first_step is not None else self.resumed_from

    def last_known(self):
        """The last step a heartbeat showed up to this attempt's end (its
        own, or an earlier attempt's when it failed before writing one)."""
        return self.last_step if self.last_step is not None else self.step_before


_signal_received = []


def on_signal(signum, frame):
    _signal_received.append(signum)


def standby_command(command):
    """The command a standby job runs: under srun a second job step in the
    same allocation, so `srun --overlap` (Slurm 20.11+): it shares the CPUs
    (and memory) of the running step instead of waiting for CPUs of its own,
    which the allocation does not have. Its ranks sleep while they wait (rank
    0 on the FIFO, the others in a tested MPI_Ibcast), so the sharing costs
    the active step nothing but their set-up."""
    if os.path.basename(command[0]) == "srun" and "--overlap" not in command:
        return command[:1] + ["--overlap"] + command[1:]
    return command


def attempt_spawn(args, a, extra):
    """Start the command for attempt `a` (with `extra` flags after ours) and
    its output pumps. False (a.reason set) when it cannot start."""
    env = dict(os.environ, GPTC_RUN_ID=a.run_id, GPTC_ATTEMPT=str(a.n))
    if os.path.basename(args.command[0]) in OPEN_MPI_LAUNCHERS and \
            not any("odls_base_sigkill_timeout" in w for w in args.command):
        env.setdefault("OMPI_MCA_odls_base_sigkill_timeout", "0")  # (OPEN_MPI_LAUNCHERS, above)
    a.at["spawned"] = wall_ms()
    command = standby_command(args.command) if a.standby else args.command
    try:
        a.proc = subprocess.Popen(command + ["--resume", "1", "--heartbeat", args.heartbeat] + extra, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
    except OSError as e:
        a.status, a.reason, a.detected = "failed", f"cannot start {args.command[0]}: {e}", wall_ms()
        return False
    a.pumps = [threading.Thread(target=output_pump, args=(a.proc.stdout, sys.stdout.buffer, a, True), daemon=True),
               threading.Thread(target=output_pump, args=(a.proc.stderr, sys.stderr.buffer, a, False), daemon=True)]
    for t in a.pumps:
        t.start()
    return True


class Spares:
    """The hot spare (--spare 1): at most one standby trainer, started in
    the background once the active attempt has done its first step."""
    MAX_DEATHS = 3  # spares that died waiting, in a row, before we stop making them

    def __init__(self, args, base):
        self.args, self.base = args, base
        self.spare = None   # the Attempt of the waiting spare
        self.count = 0      # spares started so far
        self.deaths = 0     # died while waiting, in a row
        self.dir = tempfile.mkdtemp(prefix="gptc_spare.") if args.spare else None

    def tick(self, active):
        """While `active` runs: replace a spare that died, start one when
        none waits and the active attempt has done its first step."""
        if not self.args.spare:
            return
        sp = self.spare
        if sp is not None and sp.proc.poll() is not None:
            rc = sp.proc.returncode
            how = f"killed by signal {-rc} ({signal_name(-rc)})" if rc < 0 else f"exit status {rc}"
            self.deaths += 1
            say(f"spare {sp.run_id} died while waiting ({how}); the run goes on"
                + ("; starting another" if self.deaths < self.MAX_DEATHS else
                   f"; {self.deaths} spares died in a row: no more spares (cold restarts only)"))
            self.discard(sp, "spare leftovers")
        if self.spare is None and self.deaths < self.MAX_DEATHS and "first_step" in active.at:
            self.start(active.n + 1)

    def start(self, n):
        self.count += 1
        sp = Attempt(n, f"{self.base}-spare{self.count}")
        sp.standby = sp.spare = True
        path = os.path.join(self.dir, f"go{self.count}")
        os.mkfifo(path, 0o600)
        # opened read-write by us first: the spare's open never blocks, and it
        # reads the end of the FIFO (exits) only if we go away
        sp.fifo = (path, os.open(path, os.O_RDWR | os.O_NONBLOCK))
        if not attempt_spawn(self.args, sp, ["--standby", path]):
            say(f"cannot start a spare: {sp.reason}")
            self.deaths = self.MAX_DEATHS
            self.fifo_close(sp)
            return
        say(f"spare {sp.run_id} starting (pid {sp.proc.pid}): it sets up, then waits for a failure")
        self.spare = sp

    @staticmethod
    def fifo_close(sp):
        if sp.fifo is not None:
            os.close(sp.fifo[1])
            try:
                os.remove(sp.fifo[0])
            except OSError:
                pass
            sp.fifo = None

    def discard(self, sp, why):
        """End a spare: a waiting one is dismissed (its FIFO closed, it exits
        0 having written nothing), one still setting up is killed."""
        if "standby_ready" in sp.at and sp.proc.poll() is None:
            self.fifo_close(sp)
            try:
                sp.proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        session_kill(sp.proc, why)
        self.fifo_close(sp)
        for t in sp.pumps:
            t.join(READER_JOIN_S)
        if self.spare is sp:
            self.spare = None

    def ready(self):
        sp = self.spare
        return sp is not None and "standby_ready" in sp.at and sp.proc.poll() is None

    def promote(self, n, previous):
        """The active attempt failed: the ready spare as attempt n, told to
        go; None (after killing one not ready) when there is none."""
        sp, self.spare = self.spare, None
        if sp is None:
            return None
        if sp.proc.poll() is not None or "standby_ready" not in sp.at:
            say(f"spare {sp.run_id} is not ready (still setting up): killing it, cold restart")
            self.discard(sp, "spare not ready")
            return None
        sp.n = n
        sp.step_before = previous.last_known()
        try:
            os.remove(self.args.heartbeat)  # so "no heartbeat yet" means it has not resumed
        except FileNotFoundError:
            pass
        sp.standby = False  # its lines from now on are the run's
        sp.at["promoted"] = wall_ms()
        os.write(sp.fifo[1], b"go\n")
        self.deaths = 0
        say(f"promoting spare {sp.run_id} (pid {sp.proc.pid}) to attempt {n}")
        return sp

    def close(self):
        if self.spare is not None:
            self.discard(self.spare, "spare at the end")
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def attempt_run(args, n, run_id, previous, log, spares=None, promoted=None):
    """Launch the command once (or take the promoted spare) and watch it
    until it ends; emit the (re)start record when its first step is done
    (or when it ends without one). The spares are looked after meanwhile."""
    if promoted is not None:
        a = promoted
    else:
        a = Attempt(n, run_id)
        if previous is not None:
            a.step_before = previous.last_known()
        try:
            os.remove(args.heartbeat)  # so "no heartbeat yet" means this attempt has not started
        except FileNotFoundError:
            pass
        if not attempt_spawn(args, a, []):
            record_emit(log, a, previous, "failed before its first step")
            return a
    proc, pumps = a.proc, a.pumps
    waiter = ExitWaiter(proc)
    signature, changed = None, time.monotonic()
    recorded = False
    one_process = os.path.basename(args.command[0]) not in MPI_LAUNCHERS
    while True:
        ready = spares is not None and spares.ready()
        rc = waiter.wait(SPARE_POLL_S if ready and one_process else POLL_S)
        if spares is not None and rc is None:
            spares.tick(a)
        if rc is None and ready and one_process:
            code = exit_code_if_dying(proc.pid)
            if code is not None:  # failed, its memory still being freed: promote now, clean up after
                a.detected, a.status, a.reason = wall_ms(), "failed", code_words(code) + ", seen exiting"
                sig, step = heartbeat_read(args.heartbeat)  # (before the spare's heartbeat replaces it)
                if sig is not None and sig != signature and step is not None:
                    a.step_seen(step, heartbeat=True)
                a.next = spares.promote(n + 1, a)
                break
        sig, step = heartbeat_read(args.heartbeat)
        if sig is not None and sig != signature:
            signature, changed = sig, time.monotonic()
            if step is not None:
                a.step_seen(step, heartbeat=True)
        if not recorded and "first_step" in a.at:
            record_emit(log, a, previous, "first step done")
            recorded = True
        if rc is not None:
            a.detected = wall_ms()
            if rc == 0:
                a.status = "ok"
            else:
                a.status = "failed"
                a.reason = f"killed by signal {-rc} ({signal_name(-rc)})" if rc < 0 else f"exit status {rc}"
            break
        if _signal_received:
            a.status, a.signal = "stopped", _signal_received[0]
            say(f"got {signal_name(a.signal)}: passing it to the job (process group {proc.pid}); "
                "no restart")
            try:
                os.killpg(proc.pid, a.signal)
            except ProcessLookupError:
                pass
            waiter.wait(KILL_GRACE_S)
            break
        quiet = time.monotonic() - changed
        if signature is None and quiet > args.startup_s:
            a.status, a.reason = "hang", f"no heartbeat {args.startup_s:g} s after the launch (--startup-s)"
        elif signature is not None and quiet > args.stale_s:
            a.status, a.reason = "hang", f"heartbeat unchanged for {args.stale_s:g} s (--stale-s)"
        if a.status == "hang":
            a.detected = wall_ms()
            say(f"attempt {n} hangs: {a.reason}, last at step {a.last_known()}")
            break
    waiter.close()
    if promoted is not None:
        Spares.fifo_close(a)
    session_kill(proc, f"attempt {n} {'leftovers' if a.status in ('ok', 'failed') else 'ends'}")
    for t in pumps:
        t.join(READER_JOIN_S)
    sig, step = heartbeat_read(args.heartbeat)  # a last look: the final step it reached
    if a.next is None and sig is not None and sig != signature and step is not None:
        a.step_seen(step, heartbeat=True)
    if not recorded and a.status != "stopped":  # its first step's line may have come after the exit
        outcome = ("first step done" if "first_step" in a.at else
                   "finished" if a.status == "ok" else "failed before its first step")
        record_emit(log, a, previous, outcome)
    return a


# ---------------------------------------------------------------------------
# The recovery log
# ---------------------------------------------------------------------------
PHASES = [("relaunch", "detected", "spawned"), ("launch", "spawned", "process_start"),
          ("comm_init", "process_start", "comm_ready"), ("model_setup", "comm_ready", "model_ready"),
          ("state_load", "model_ready", "state_loaded"),
          ("first_step", "state_loaded", "first_step")]


# a promoted spare: its launch and set-up happened before the failure
SPARE_PHASES = [("promote", "detected", "promoted"), ("wake", "promoted", "model_ready"),
                ("state_load", "model_ready", "state_loaded"), ("first_step", "state_loaded", "first_step")]


def record_emit(log, a, previous, outcome):
    """The (re)start record of attempt `a`; `previous` is the failed attempt
    it recovers from (None for the first launch)."""
    at = {"detected": previous.detected} if previous is not None else {}
    at.update(a.at)
    ms = {}
    phases = SPARE_PHASES if "promoted" in at else PHASES
    for name, begin, end in phases:
        if begin in at and end in at:
            ms[name] = round(at[end] - at[begin])
    origin = "detected" if previous is not None else "spawned"
    if "first_step" in at:
        ms["total"] = round(at["first_step"] - at[origin])
    rec = {"event": "recovery" if previous is not None else "start", "attempt": a.n, "run_id": a.run_id,
           "hot_spare": "promoted" in at,
           "outcome": outcome, "at": {k: round(v) for k, v in at.items()}, "ms": ms,
           "resumed_from": a.resumed_from, "resumed_how": a.resumed_how}
    if previous is not None:
        lost = None
        if previous.last_known() is not None and a.resumed_from is not None:
            lost = previous.last_known() - a.resumed_from
        rec.update(failed_attempt=previous.n, failure=previous.reason, last_step=previous.last_known(),
                   steps_lost=lost)
    log_write(log, rec)

    def show(key):
        return f"{ms[key]} ms" if key in ms else "?"

    split = " + ".join(f"{name.replace('_', ' ')} {show(name)}" for name, _, _ in phases[previous is None:])
    if previous is None:
        head = f"start of attempt {a.n}: "
        tail = f" = {show('total')} from spawn to first step"
    else:
        head = (f"recovery: attempt {a.n}{' (hot spare)' if 'promoted' in at else ''} after attempt {previous.n} "
                f"({previous.reason}, last step done "
                f"{previous.last_known()}): ")
        tail = f" = {show('total')} from failure detected to first step"
    resumed = "?" if a.resumed_from is None else a.resumed_from
    lost = "" if previous is None else f", {rec['steps_lost'] if rec['steps_lost'] is not None else '?'} step(s) lost"
    how = f" ({a.resumed_how})" if a.resumed_how else ""
    say(f"{head}{split}{tail} ({outcome}); resumed from step {resumed}{how}{lost}")


def log_write(log, rec):
    if log is not None:
        log.write(json.dumps(rec) + "\n")
        log.flush()


# ---------------------------------------------------------------------------
# main: attempt after attempt, until one succeeds or the retries run out
# ---------------------------------------------------------------------------
def main():
    args = options_parse(sys.argv[1:])
    tmpdir = None
    if not args.heartbeat:
        tmpdir = tempfile.mkdtemp(prefix="gptc_supervise.")
        args.heartbeat = os.path.join(tmpdir, "heartbeat")
    for path in (args.heartbeat, args.recovery_log):  # e.g. in --output-dir, which the trainer makes later
        if path and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    log = open(args.recovery_log, "a") if args.recovery_log else None
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    base = f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
    furthest = None  # the furthest step any attempt's heartbeat showed
    no_progress = 0  # consecutive failed attempts that did not get past it
    previous = None
    n = 0
    spares = Spares(args, base)
    try:
        while True:
            n += 1
            promoted = None
            if previous is not None:  # (promoted already when the failed attempt was seen exiting)
                promoted = previous.next if previous.next is not None else spares.promote(n, previous)
            a = attempt_run(args, n, f"{base}-{n}", previous, log, spares, promoted)
            if a.status == "ok":
                say(f"attempt {n} finished (exit status 0) after {n - 1} restart(s)")
                log_write(log, {"event": "finished", "attempt": n, "restarts": n - 1, "at": round(wall_ms())})
                return 0
            if a.status == "stopped" or _signal_received:
                a.signal = a.signal or _signal_received[0]
                say(f"stopped by {signal_name(a.signal)} during attempt {n}")
                log_write(log, {"event": "stopped", "attempt": n, "signal": a.signal, "at": round(wall_ms())})
                return 128 + a.signal
            progressed = (a.last_step is not None and a.started_at() is not None and
                          a.last_step > a.started_at() and (furthest is None or a.last_step > furthest))
            if a.last_step is not None:
                furthest = a.last_step if furthest is None else max(furthest, a.last_step)
            no_progress = 0 if progressed else no_progress + 1
            last = f"; its last line: {a.tail[-1]}" if a.tail else ""
            if no_progress > args.retries:
                say(f"giving up: attempt {n} failed ({a.reason}){last}; {no_progress} failure(s) in a row without "
                    f"progress past step {furthest} (--retries {args.retries}). Fix the cause, then run the same "
                    "command again: it resumes from the newest complete state")
                log_write(log, {"event": "gave_up", "attempt": n, "failure": a.reason, "furthest_step": furthest,
                                "failures_without_progress": no_progress, "at": round(wall_ms())})
                if a.next is not None:
                    session_kill(a.next.proc, "the promoted spare (giving up)")
                return 1
            say(f"attempt {n} failed ({a.reason}) at step {a.last_known()}{last}; restarting "
                f"({no_progress} of {args.retries} failure(s) in a row without progress)")
            previous = a
    finally:
        spares.close()
        if log is not None:
            log.close()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
