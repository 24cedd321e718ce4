// alpaca.go: reads Alpaca-style instruction data and renders it with the
// Stanford Alpaca prompt templates (TEMPLATE.md states them and the rules),
// and walks the records of any JSON or JSONL data file (chat.go reads the
// conversation formats through the same walk).
//
// A file is a JSON array of objects or JSONL (one object per line, blank
// lines skipped), told apart by its first non-space byte ('[' = array), not
// by its extension. Fields: "instruction" (required, not blank), "input"
// (optional), "output" (required, may be empty); other fields are ignored,
// keys match case-insensitively (encoding/json's rule). Errors name the file
// and the line and byte column, or the record and its line. Limit: the whole
// file is read into memory.

package data

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// The Stanford Alpaca templates; %s are the instruction and the input.
const (
	alpacaWithInput = "Below is an instruction that describes a task, paired with an input that provides further context. " +
		"Write a response that appropriately completes the request.\n\n" +
		"### Instruction:\n%s\n\n### Input:\n%s\n\n### Response:\n"
	alpacaNoInput = "Below is an instruction that describes a task. " +
		"Write a response that appropriately completes the request.\n\n" +
		"### Instruction:\n%s\n\n### Response:\n"
)

// AlpacaPrompt renders an instruction and an optional input with the Alpaca
// template: the no-input variant when input is empty or only white space.
// Both are inserted verbatim.
func AlpacaPrompt(instruction, input string) string {
	if strings.TrimSpace(input) == "" {
		return fmt.Sprintf(alpacaNoInput, instruction)
	}
	return fmt.Sprintf(alpacaWithInput, instruction, input)
}

// alpacaRaw is one object of the file. Pointers tell a missing or null
// field from an empty string.
type alpacaRaw struct {
	Instruction *string `json:"instruction"`
	Input       *string `json:"input"`
	Output      *string `json:"output"`
}

// ReadAlpaca reads an Alpaca JSON or JSONL file and returns its records,
// rendered, in file order.
func ReadAlpaca(path string) ([]Record, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	recs, _, err := parseAlpaca(path, raw)
	return recs, err
}

// parseAlpaca parses the bytes of file name as Alpaca records, whatever
// their fields; kind is "JSON array" or "JSONL", for logs.
func parseAlpaca(name string, raw []byte) (recs []Record, kind string, err error) {
	kind, err = walkRecords(name, raw, func(v []byte) error {
		r, err := alpacaRecord(v)
		recs = append(recs, r.rec)
		return err
	})
	if err == nil && len(recs) == 0 {
		err = fmt.Errorf("data: %s holds no records", name)
	}
	return recs, kind, err
}

// parseRecords parses the bytes of file name as records of the format its
// first record's fields name: "messages" (OpenAI-style messages),
// "conversations" (ShareGPT), anything else Alpaca. Every record must be of
// that format. kind is "JSON array" or "JSONL", for logs.
func parseRecords(name string, raw []byte) (items []item, format, kind string, err error) {
	var parse func([]byte) (item, error)
	kind, err = walkRecords(name, raw, func(v []byte) error {
		if parse == nil {
			format, parse = detectFormat(v)
		}
		it, err := parse(v)
		items = append(items, it)
		return err
	})
	if err == nil && len(items) == 0 {
		err = fmt.Errorf("data: %s holds no records", name)
	}
	return items, format, kind, err
}

// walkRecords calls each with every record of a JSON array or JSONL file
// (the first non-space byte decides: '[' is an array), in order, and wraps
// its error with the file, the record and its line.
func walkRecords(name string, raw []byte, each func([]byte) error) (kind string, err error) {
	raw = bytes.TrimPrefix(raw, []byte("\xef\xbb\xbf")) // a UTF-8 BOM
	trimmed := bytes.TrimLeft(raw, " \t\r\n")
	if len(trimmed) == 0 {
		return "", fmt.Errorf("data: %s is empty", name)
	}
	if trimmed[0] == '[' {
		return "JSON array", parseArray(name, raw, each)
	}
	return "JSONL", parseLines(name, raw, each)
}

// parseArray reads a top-level JSON array of objects.
func parseArray(name string, raw []byte, each func([]byte) error) error {
	// The scanner behind json.Unmarshal reports exact byte offsets; the
	// Decoder's offsets are relative to its internal buffer. So syntax is
	// checked on the whole file first, and the Decoder (whose InputOffset is
	// exact between values) then walks the valid array for record lines.
	var whole []json.RawMessage
	if err := json.Unmarshal(raw, &whole); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line, col := lineCol(raw, offendingByte(raw, se.Offset))
			return fmt.Errorf("data: %s:%d:%d: malformed JSON: %v", name, line, col, se)
		}
		// Valid JSON but not an array (cannot happen after '[', kept for
		// safety).
		return fmt.Errorf("data: %s: %w", name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // the '['
		return fmt.Errorf("data: %s: %w", name, err)
	}
	for i := 0; dec.More(); i++ {
		start := int(dec.InputOffset())
		var v json.RawMessage
		err := dec.Decode(&v)
		line, _ := lineCol(raw, valueStart(raw, start))
		if err != nil {
			return fmt.Errorf("data: %s: record %d (line %d): %s", name, i, line, describeDecodeErr(err))
		}
		if err := each(v); err != nil {
			return fmt.Errorf("data: %s: record %d (line %d): %w", name, i, line, err)
		}
	}
	return nil
}

// parseLines reads JSONL: one object per non-blank line.
func parseLines(name string, raw []byte, each func([]byte) error) error {
	n := 0
	for lineNo, rest := 1, raw; len(rest) > 0; lineNo++ {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var v json.RawMessage
		if err := json.Unmarshal(line, &v); err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) {
				_, col := lineCol(line, offendingByte(line, se.Offset))
				return fmt.Errorf("data: %s:%d:%d: malformed JSON (JSONL wants one object per line): %v", name, lineNo, col, se)
			}
			return fmt.Errorf("data: %s: record %d (line %d): %s", name, n, lineNo, describeDecodeErr(err))
		}
		if err := each(v); err != nil {
			return fmt.Errorf("data: %s: record %d (line %d): %w", name, n, lineNo, err)
		}
		n++
	}
	return nil
}

// alpacaRecord decodes and renders one Alpaca record.
func alpacaRecord(v []byte) (item, error) {
	var r alpacaRaw
	if err := json.Unmarshal(v, &r); err != nil {
		return item{}, errors.New(describeDecodeErr(err))
	}
	rec, err := r.record()
	return item{rec: rec}, err
}

// record checks the fields and renders the record.
func (r *alpacaRaw) record() (Record, error) {
	switch {
	case r.Instruction == nil:
		return Record{}, errors.New(`missing field "instruction"`)
	case strings.TrimSpace(*r.Instruction) == "":
		return Record{}, errors.New(`field "instruction" is empty`)
	case r.Output == nil:
		return Record{}, errors.New(`missing field "output"`)
	}
	input := ""
	if r.Input != nil {
		input = *r.Input
	}
	return Record{Prompt: AlpacaPrompt(*r.Instruction, input), Response: *r.Output}, nil
}

// describeDecodeErr words a decoding error of a syntactically valid value.
func describeDecodeErr(err error) string {
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return fmt.Sprintf("field %q is a JSON %s, want a string", te.Field, te.Value)
	case errors.As(err, &te):
		return fmt.Sprintf("a JSON %s, want an object", te.Value)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of file"
	}
	return err.Error()
}

// offendingByte turns a SyntaxError offset ("after reading Offset bytes")
// into the index of the byte at fault, moved past white space since a
// syntax error is never white space itself.
func offendingByte(raw []byte, offset int64) int {
	p := int(max(offset-1, 0))
	for p < len(raw) && isSpace(raw[p]) {
		p++
	}
	if p >= len(raw) { // the input ended early: point at its last byte
		p = len(bytes.TrimRight(raw, " \t\r\n")) - 1
	}
	return max(p, 0)
}

// valueStart skips the white space and comma before an array element.
func valueStart(raw []byte, p int) int {
	for p < len(raw) && (isSpace(raw[p]) || raw[p] == ',') {
		p++
	}
	return p
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// lineCol returns the 1-based line and byte column of raw[p].
func lineCol(raw []byte, p int) (line, col int) {
	p = min(max(p, 0), len(raw))
	line = 1 + bytes.Count(raw[:p], []byte{'\n'})
	col = p - bytes.LastIndexByte(raw[:p], '\n')
	return line, col
}
