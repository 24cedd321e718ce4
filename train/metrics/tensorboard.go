// tensorboard.go: the metrics as TensorBoard event files, so that
// `tensorboard --logdir out/tb` shows them with no converter. Each process
// writes its own file, <dir>/events.out.tfevents.<unix time>.<host>.<ns>.<pid>:
// TFRecords (a little-endian uint64 length, its masked CRC-32C, the data,
// the data's masked CRC-32C) holding tensorflow.Event protobufs
// (tensorflow/core/util/event.proto), encoded with protowire. The first
// record is the file version, "brain.Event:2"; each metrics record with
// values becomes one Event at its step, a Summary of simple_value scalars.
// A resumed run's file starts with a SessionLog START at the step after
// the checkpoint: TensorBoard then drops that step and later ones of the
// earlier files (the steps a killed run took after its checkpoint), as
// metrics.jsonl is cut back.
//
// Limits: scalars only (no histograms, no text); a record is written with
// one write call, so a crash can cut at most the last one short, which
// TensorBoard's reader skips.

package metrics

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// FileVersion is the version record every events file starts with.
const FileVersion = "brain.Event:2"

// Fields of tensorflow.Event, tensorflow.Summary(.Value) and
// tensorflow.SessionLog that the writer uses.
const (
	eventWallTime    protowire.Number = 1 // double
	eventStep        protowire.Number = 2 // int64
	eventFileVersion protowire.Number = 3 // string
	eventSummary     protowire.Number = 5 // Summary
	eventSessionLog  protowire.Number = 7 // SessionLog
	summaryValue     protowire.Number = 1 // repeated Summary.Value
	valueTag         protowire.Number = 1 // string
	valueSimple      protowire.Number = 2 // float
	sessionStatus    protowire.Number = 1 // SessionLog.SessionStatus
	sessionStart                      = 1 // SessionLog.START
)

// Scalar is one tagged value of an Event's Summary.
type Scalar struct {
	Tag   string
	Value float32
}

// TBWriter appends Records to a TensorBoard events file. Its methods are
// called under the metrics Writer's lock.
type TBWriter struct {
	path string
	f    *os.File
	now  func() time.Time
}

// CreateTB starts this process's events file in dir (created when
// missing). resumeStep >= 0 is the checkpoint's step of a resumed run:
// the file then says the session starts again after it.
func CreateTB(dir string, resumeStep int) (*TBWriter, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tensorboard: %w", err)
	}
	host, err := os.Hostname()
	if err != nil {
		host = "localhost"
	}
	t := &TBWriter{now: time.Now}
	now := t.now()
	// TensorBoard reads a directory's files in name order: the seconds,
	// then the nanoseconds, keep a resumed run's after the run before it,
	// also within one second (tests); the pid tells processes apart, and
	// an existing name is never written over.
	for ns := now.Nanosecond(); ; ns++ {
		t.path = filepath.Join(dir, fmt.Sprintf("events.out.tfevents.%010d.%s.%09d.%d", now.Unix(), host, ns, os.Getpid()))
		t.f, err = os.OpenFile(t.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("tensorboard: %w", err)
	}
	rec := AppendTFRecord(nil, AppendFileVersion(nil, wallTime(now)))
	if resumeStep >= 0 {
		rec = AppendTFRecord(rec, AppendSessionStart(nil, wallTime(now), int64(resumeStep+1)))
	}
	if err := t.write(rec); err != nil {
		t.f.Close()
		return nil, err
	}
	return t, nil
}

// Path is the events file's path.
func (t *TBWriter) Path() string { return t.path }

// Write appends r's values as one Event at r's step; a record without
// values (a projector check, a skipped step) writes nothing.
func (t *TBWriter) Write(r Record) error {
	var s []Scalar
	for _, v := range []struct {
		tag string
		x   *float64
	}{
		{"train/loss", r.TrainLoss}, {"train/learning_rate", r.LR}, {"train/grad_norm", r.GradNorm},
		{"train/tokens_per_s", r.TokensPerSec}, {"eval/loss", r.EvalLoss}, {"eval/perplexity", r.Perplexity}, {"eval/exact_match", r.ExactMatch},
	} {
		if v.x != nil {
			s = append(s, Scalar{v.tag, float32(*v.x)})
		}
	}
	if len(s) == 0 || r.Profile != nil {
		return nil
	}
	return t.write(AppendTFRecord(nil, AppendScalars(nil, wallTime(t.now()), int64(r.Step), s)))
}

func (t *TBWriter) write(b []byte) error {
	if _, err := t.f.Write(b); err != nil {
		return fmt.Errorf("tensorboard: write %s: %w", t.path, err)
	}
	return nil
}

// Close closes the file.
func (t *TBWriter) Close() error { return t.f.Close() }

// wallTime is t in seconds since the epoch, as Event.wall_time.
func wallTime(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// appendHead appends an Event's wall_time and step; zeros are left out,
// as proto3 encoders do.
func appendHead(b []byte, wall float64, step int64) []byte {
	if wall != 0 {
		b = protowire.AppendTag(b, eventWallTime, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(wall))
	}
	if step != 0 {
		b = protowire.AppendTag(b, eventStep, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(step))
	}
	return b
}

// AppendFileVersion appends the Event that opens every events file.
func AppendFileVersion(b []byte, wall float64) []byte {
	b = appendHead(b, wall, 0)
	b = protowire.AppendTag(b, eventFileVersion, protowire.BytesType)
	return protowire.AppendString(b, FileVersion)
}

// AppendSessionStart appends an Event holding a SessionLog START at step.
func AppendSessionStart(b []byte, wall float64, step int64) []byte {
	b = appendHead(b, wall, step)
	var log []byte
	log = protowire.AppendTag(log, sessionStatus, protowire.VarintType)
	log = protowire.AppendVarint(log, sessionStart)
	b = protowire.AppendTag(b, eventSessionLog, protowire.BytesType)
	return protowire.AppendBytes(b, log)
}

// AppendScalars appends an Event at step whose Summary holds the scalars.
func AppendScalars(b []byte, wall float64, step int64, scalars []Scalar) []byte {
	b = appendHead(b, wall, step)
	var sum []byte
	for _, s := range scalars {
		var v []byte
		v = protowire.AppendTag(v, valueTag, protowire.BytesType)
		v = protowire.AppendString(v, s.Tag)
		v = protowire.AppendTag(v, valueSimple, protowire.Fixed32Type)
		v = protowire.AppendFixed32(v, math.Float32bits(s.Value))
		sum = protowire.AppendTag(sum, summaryValue, protowire.BytesType)
		sum = protowire.AppendBytes(sum, v)
	}
	b = protowire.AppendTag(b, eventSummary, protowire.BytesType)
	return protowire.AppendBytes(b, sum)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC is TFRecord's checksum: the CRC-32C of b, rotated and offset
// so that a CRC of data holding CRCs stays well distributed.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

// AppendTFRecord appends data framed as one TFRecord.
func AppendTFRecord(b, data []byte) []byte {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(data)))
	b = append(b, n[:]...)
	b = binary.LittleEndian.AppendUint32(b, MaskedCRC(n[:]))
	b = append(b, data...)
	return binary.LittleEndian.AppendUint32(b, MaskedCRC(data))
}

// Event is the part of a tensorflow.Event ReadTB decodes.
type Event struct {
	WallTime     float64
	Step         int64
	FileVersion  string
	SessionStart bool     // a SessionLog START
	Scalars      []Scalar // the Summary's simple_value values
	Data         []byte   // the record's bytes, the encoded Event
}

// ReadTB reads the Events of an events file, checking each record's
// framing and both CRCs; a record cut short at the end (a crash) ends the
// list without an error. Fields it does not know are skipped.
func ReadTB(path string) ([]Event, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tensorboard: %w", err)
	}
	var evs []Event
	for off := 0; len(raw) > 0; {
		if len(raw) < 12 {
			break
		}
		n := binary.LittleEndian.Uint64(raw)
		if MaskedCRC(raw[:8]) != binary.LittleEndian.Uint32(raw[8:]) {
			return evs, fmt.Errorf("tensorboard: %s at byte %d: the length's CRC does not match", path, off)
		}
		if len(raw) < 16 || n > uint64(len(raw)-16) {
			break
		}
		data := raw[12 : 12+n]
		if MaskedCRC(data) != binary.LittleEndian.Uint32(raw[12+n:]) {
			return evs, fmt.Errorf("tensorboard: %s at byte %d: the data's CRC does not match", path, off)
		}
		ev, err := decodeEvent(data)
		if err != nil {
			return evs, fmt.Errorf("tensorboard: %s at byte %d: %w", path, off, err)
		}
		evs = append(evs, ev)
		raw, off = raw[16+n:], off+16+int(n)
	}
	return evs, nil
}

// decodeEvent decodes the fields of an Event that Event holds.
func decodeEvent(b []byte) (Event, error) {
	ev := Event{Data: b}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == eventWallTime && typ == protowire.Fixed64Type:
			ev.WallTime = math.Float64frombits(x)
		case num == eventStep && typ == protowire.VarintType:
			ev.Step = int64(x)
		case num == eventFileVersion && typ == protowire.BytesType:
			ev.FileVersion = string(v)
		case num == eventSessionLog && typ == protowire.BytesType:
			return eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
				if num == sessionStatus && typ == protowire.VarintType && x == sessionStart {
					ev.SessionStart = true
				}
				return nil
			})
		case num == eventSummary && typ == protowire.BytesType:
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num != summaryValue || typ != protowire.BytesType {
					return nil
				}
				var s Scalar
				simple := false
				err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
					switch {
					case num == valueTag && typ == protowire.BytesType:
						s.Tag = string(v)
					case num == valueSimple && typ == protowire.Fixed32Type:
						s.Value, simple = math.Float32frombits(uint32(x)), true
					}
					return nil
				})
				if simple {
					ev.Scalars = append(ev.Scalars, s)
				}
				return err
			})
		}
		return nil
	})
	return ev, err
}

// eachField calls fn with each field of the message b: its number, wire
// type, and its bytes (BytesType) or value (the numeric types).
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x32 uint32
			x32, n = protowire.ConsumeFixed32(b)
			x = uint64(x32)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
