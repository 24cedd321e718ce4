//go:build cuda || cudasim

// The device thread: one goroutine per backend, locked to its OS thread,
// with the backend's device current on it. Every CUDA call that enqueues
// work or changes a resource runs there (worker.do), so the runtime's
// per-thread state (the current device, the last error, the simulator's
// message) is the backend's alone and never changes under it, whatever
// thread the calling goroutine happens to run on.

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

type worker struct {
	calls  chan func()
	exited chan struct{} // closed when the goroutine has returned

	mu      sync.RWMutex // held (read) while a call is handed over; stop takes it
	stopped bool
}

var errWorkerStopped = errors.New("the backend's device thread has stopped (backend closed)")

// startWorker starts the device thread of device dev and returns once the
// device is current on it.
func startWorker(dev int) (*worker, error) {
	w := &worker{calls: make(chan func()), exited: make(chan struct{})}
	ready := make(chan error, 1)
	go w.loop(dev, ready)
	if err := <-ready; err != nil {
		<-w.exited
		return nil, err
	}
	return w, nil
}

func (w *worker) loop(dev int, ready chan<- error) {
	// Never unlocked: when the goroutine returns, Go ends the thread and
	// its CUDA state with it, rather than handing it to other goroutines.
	runtime.LockOSThread()
	defer close(w.exited)
	markWorker()
	if err := rtSetDevice(dev); err != nil {
		ready <- fmt.Errorf("cuda: device %d: %w", dev, err)
		return
	}
	ready <- nil
	for f := range w.calls {
		f()
	}
}

// do runs f on the device thread and returns its error once it has run. A
// panic in f comes back as an error.
func (w *worker) do(f func() error) error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.stopped {
		return errWorkerStopped
	}
	done := make(chan error, 1)
	w.calls <- func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("cuda: panic on the device thread: %v", r)
			}
		}()
		done <- f()
	}
	return <-done
}

// stop ends the device thread after the calls handed over so far.
func (w *worker) stop() {
	w.mu.Lock()
	if !w.stopped {
		w.stopped = true
		close(w.calls)
	}
	w.mu.Unlock()
	<-w.exited
}
