// workers.go: a pool of goroutines locked to OS threads and pinned to cores,
// which runs data-parallel loops split in chunks, and asynchronous
// submissions that return a completion to wait on.
//
// Limits: pinning is Linux-only (SchedSetaffinity); a worker's thread is
// never returned to the Go runtime (it exits with the worker). Chunks are
// taken dynamically, so which worker runs a chunk varies from run to run;
// callers that need determinism make each chunk's result independent of the
// worker (the Adam code does).

package host

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrWorkersClosed is returned for work handed to a closed pool.
var ErrWorkersClosed = errors.New("host: worker pool is closed")

// WorkersOptions configures NewWorkers.
type WorkersOptions struct {
	// N is the number of workers; 0 means one per CPU the process may run on.
	N int
	// CPUs lists the cores to pin to, worker i to CPUs[i % len(CPUs)];
	// empty means the cores of the process's affinity mask, in order.
	CPUs []int
	// NoPin leaves the workers' threads unpinned (they are still locked).
	NoPin bool
}

// Workers is a pool of pinned worker threads. Its methods are safe for
// concurrent use.
type Workers struct {
	n     int
	cpus  []int // the core of each worker; nil when unpinned
	tasks chan *workersTask

	mu     sync.RWMutex // senders hold it read-locked; Close write-locks
	closed bool
	alive  sync.WaitGroup
}

// workersTask is one data-parallel loop: chunks are claimed with an atomic
// counter by whichever workers received the task.
type workersTask struct {
	chunks int64
	next   atomic.Int64
	fn     func(chunk int)
	left   sync.WaitGroup // one count per chunk

	errMu sync.Mutex
	err   error
}

// NewWorkers starts the pool. It fails if a worker cannot be pinned.
func NewWorkers(opt WorkersOptions) (*Workers, error) {
	cpus := opt.CPUs
	if len(cpus) == 0 {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			return nil, fmt.Errorf("host: workers: reading the CPU affinity mask: %w", err)
		}
		for c := 0; c < len(set)*64; c++ {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
		if len(cpus) == 0 {
			return nil, errors.New("host: workers: empty CPU affinity mask")
		}
	}
	n := opt.N
	if n < 0 {
		return nil, fmt.Errorf("host: workers: N = %d, want >= 0", n)
	}
	if n == 0 {
		n = len(cpus)
	}
	w := &Workers{n: n, tasks: make(chan *workersTask, 64*n)}
	if !opt.NoPin {
		w.cpus = make([]int, n)
		for i := range w.cpus {
			w.cpus[i] = cpus[i%len(cpus)]
		}
	}
	ready := make(chan error, n)
	w.alive.Add(n)
	for i := 0; i < n; i++ {
		cpu := -1
		if w.cpus != nil {
			cpu = w.cpus[i]
		}
		go w.work(cpu, ready)
	}
	var firstErr error
	for i := 0; i < n; i++ {
		if err := <-ready; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		w.Close()
		return nil, firstErr
	}
	return w, nil
}

// work is one worker's loop. The thread stays locked for the goroutine's
// whole life, so it exits with it and its affinity never leaks into the
// runtime's thread pool.
func (w *Workers) work(cpu int, ready chan<- error) {
	defer w.alive.Done()
	runtime.LockOSThread()
	var err error
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		if e := unix.SchedSetaffinity(0, &set); e != nil {
			err = fmt.Errorf("host: workers: pinning a worker to CPU %d: %w", cpu, e)
		}
	}
	ready <- err
	for t := range w.tasks {
		t.run()
	}
}

func (t *workersTask) run() {
	for {
		c := t.next.Add(1) - 1
		if c >= t.chunks {
			return
		}
		t.runChunk(int(c))
	}
}

// runChunk turns a panic in the loop body into the task's error, so a bug in
// one chunk cannot take the process down from a worker thread.
func (t *workersTask) runChunk(c int) {
	defer t.left.Done()
	defer func() {
		if r := recover(); r != nil {
			t.errMu.Lock()
			if t.err == nil {
				t.err = fmt.Errorf("host: workers: chunk %d panicked: %v", c, r)
			}
			t.errMu.Unlock()
		}
	}()
	t.fn(c)
}

// N returns the number of workers.
func (w *Workers) N() int { return w.n }

// CPUs returns the core each worker is pinned to (nil when unpinned).
func (w *Workers) CPUs() []int { return append([]int(nil), w.cpus...) }

// ParallelFor runs fn(0) ... fn(chunks-1) on the workers and returns when all
// have finished. Chunks should be big enough (tens of microseconds of work)
// that handing them out costs nothing noticeable. A panic in fn is returned
// as an error after the other chunks have run. fn must not call ParallelFor
// on the same pool (a worker waiting for its own pool can deadlock it).
func (w *Workers) ParallelFor(chunks int, fn func(chunk int)) error {
	if chunks <= 0 {
		return nil
	}
	t := &workersTask{chunks: int64(chunks), fn: fn}
	t.left.Add(chunks)
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return ErrWorkersClosed
	}
	// One copy per worker that can have work; a copy arriving after all
	// chunks are claimed returns at once.
	for i := 0; i < min(w.n, chunks); i++ {
		w.tasks <- t
	}
	w.mu.RUnlock()
	t.left.Wait()
	return t.err
}

// WorkersCompletion is the handle of asynchronous work: wait on it, or
// select on Done.
type WorkersCompletion struct {
	done chan struct{}
	err  error
}

// Done is closed when the work has finished.
func (c *WorkersCompletion) Done() <-chan struct{} { return c.done }

// Wait blocks until the work has finished and returns its error.
func (c *WorkersCompletion) Wait() error {
	<-c.done
	return c.err
}

// Submit runs fn on a new coordinating goroutine (which typically calls
// ParallelFor) and returns at once; the caller never blocks on the work. A
// panic in fn becomes the completion's error.
func (w *Workers) Submit(fn func() error) *WorkersCompletion {
	c := &WorkersCompletion{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer func() {
			if r := recover(); r != nil {
				c.err = fmt.Errorf("host: workers: submitted work panicked: %v", r)
			}
		}()
		c.err = fn()
	}()
	return c
}

// Close stops the pool after the work already handed to it has run, and
// waits for the workers to exit. Later calls are no-ops.
func (w *Workers) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.tasks)
	w.mu.Unlock()
	w.alive.Wait()
}
