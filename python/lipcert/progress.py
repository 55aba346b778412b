"""Running a long C++ call: a worker thread, a progress display and Ctrl-C.

The C++ call runs in a worker thread with the GIL released; the calling thread polls it
every 0.1 s, updates the display and is where Python delivers SIGINT. On Ctrl-C the run is
asked to stop (CertifyOptions::stop: every stage ends at its next check) and its
certificate so far is returned, status interrupted: every certificate lipcert reports is
sound at any moment, so stopping early only widens the gap. A second Ctrl-C returns the
last improved (in-progress) certificate at once, leaving the worker to end in the
background. Calls with nothing to stop (search, sweep) raise KeyboardInterrupt.
"""

import sys
import threading
import time


class _Line:
    """One stderr line: rewritten in place on a terminal; elsewhere (a log file) a new line
    only when the text changes, so that logs stay short."""

    def __init__(self, label, total):
        self.label, self.total, self.width, self.last = label, total, 0, None
        self.tty = sys.stderr.isatty()

    def update(self, elapsed, text):
        line = f"{self.label}: {elapsed:5.1f}/{self.total:g} s  {text}"
        if self.tty:
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
        elif text != self.last:
            sys.stderr.write(line + "\n")
        self.last = text
        sys.stderr.flush()

    def close(self):
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


class _Bar:
    """A tqdm bar over the time limit (tqdm.auto: a widget in notebooks)."""

    def __init__(self, tqdm, label, total):
        self.bar = tqdm(total=total, desc=label, unit="s", leave=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:g} s {postfix}")

    def update(self, elapsed, text):
        self.bar.n = min(elapsed, self.bar.total)
        self.bar.set_postfix_str(text, refresh=False)
        self.bar.refresh()

    def close(self):
        self.bar.close()


def _display(label, total):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Line(label, total)
    return _Bar(tqdm, label, total)


def _bounds_text(upper, lower):
    return f"upper {upper:.6g}  lower {lower:.6g}"


def run_in_worker(call, *, progress, label, total_s, poll=None, on_interrupt=None):
    """Runs call() in a worker thread and returns (result, interrupted).

    poll() -> text or None, shown beside the elapsed time; on_interrupt() is called once on
    the first Ctrl-C and returns (stop_requested, fallback): when stop_requested the worker
    is awaited and its result returned; otherwise fallback is returned at once (or, when it
    is None, KeyboardInterrupt is raised again). A second Ctrl-C while waiting for the
    stop returns the fallback when there is one.
    """
    box = {}
    # The worker's end is signalled by an Event, not read from Thread.is_alive(): a join()
    # interrupted by KeyboardInterrupt can leave is_alive() False while the thread still runs.
    done = threading.Event()

    def work():
        try:
            box["result"] = call()
        except BaseException as e:  # re-raised in the calling thread
            box["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=work, name="lipcert-worker", daemon=True)
    display = _display(label, total_s) if progress else None
    start = time.monotonic()
    interrupted = False
    fallback = None
    worker.start()
    try:
        while not done.is_set():
            try:
                done.wait(0.1)
                if display is not None:
                    text = poll() if poll else None
                    display.update(time.monotonic() - start, text or "")
            except KeyboardInterrupt:
                if interrupted:  # a second Ctrl-C: do not wait for the stop
                    if fallback is not None:
                        return fallback, True
                    raise
                interrupted = True
                stop_requested, fallback = on_interrupt() if on_interrupt else (False, None)
                if not stop_requested:
                    if fallback is None:
                        raise
                    return fallback, True
    finally:
        if display is not None:
            display.close()
    if "error" in box:
        raise box["error"]
    return box["result"], interrupted
