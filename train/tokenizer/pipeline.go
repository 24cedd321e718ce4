// pipeline.go: the normalizers, pre-tokenizers and decoders of a
// tokenizer.json that byte-level and SentencePiece-style BPE tokenizers use,
// each read from its JSON object. A type not listed here is an error naming
// the field, never silently skipped: a skipped step would give other ids.

package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// gpt2Pattern is the split regex of the ByteLevel pre-tokenizer (use_regex).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// typed is the "type" of a pipeline step's JSON object.
type typed struct {
	Type string `json:"type"`
}

// stepType is the "type" of the normalizer, pre-tokenizer or decoder at
// field; null says there is none (the field absent or null).
func stepType(raw json.RawMessage, field string) (typ string, null bool, err error) {
	if isNull(raw) {
		return "", true, nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", false, fmt.Errorf("%s: %w", field, err)
	}
	return t.Type, false, nil
}

// replaceArgs are the arguments of a Replace normalizer or decoder.
type replaceArgs struct {
	Pattern pattern `json:"pattern"`
	Content string  `json:"content"`
}

// pattern is the {"String": s} or {"Regex": r} of Split and Replace.
type pattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// compileRegex compiles a split pattern with regexp2 (the library's
// Oniguruma syntax is close to .NET's, lookaheads included), always by its
// interpreter: regexp2.MustCompile would take the matcher that
// github.com/tiktoken-go/tokenizer generates and registers for the exact
// GPT-2 pattern, which drops DEL from a character class ("\x7f's" split
// as "\x7f" + "'s", not "\x7f'" + "s" as the tokenizers library does;
// the fixtures hold that case). Compile never looks registered ones up.
func compileRegex(expr string) (*regexp2.Regexp, error) {
	return regexp2.Compile(expr, regexp2.None)
}

// compile returns a matcher of p: a regular expression or a literal string.
func (p pattern) compile(field string) (*regexp2.Regexp, error) {
	switch {
	case p.Regex != nil:
		re, err := compileRegex(*p.Regex)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		return re, nil
	case p.String != nil:
		return compileRegex(regexp2.Escape(*p.String))
	}
	return nil, fmt.Errorf("%s: neither String nor Regex", field)
}

// matches returns the byte spans of the matches of re in s.
func matches(re *regexp2.Regexp, s string) [][]int {
	m, err := re.FindAllStringIndex(s, -1)
	if err != nil { // only a match timeout, and none is set
		return nil
	}
	return m
}

// --- normalizers ---

type normalizer func(string) string

func parseNormalizer(raw json.RawMessage, field string) ([]normalizer, error) {
	typ, null, err := stepType(raw, field)
	if null || err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		return parseSequence(raw, field, "normalizers", parseNormalizer)
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		return []normalizer{func(s string) string {
			if s == "" {
				return s
			}
			return p.Prepend + s
		}}, nil
	case "Replace":
		var p replaceArgs
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		if p.Pattern.String != nil {
			old := *p.Pattern.String
			return []normalizer{func(s string) string { return strings.ReplaceAll(s, old, p.Content) }}, nil
		}
		re, err := p.Pattern.compile(field + ".pattern")
		if err != nil {
			return nil, err
		}
		return []normalizer{func(s string) string { return replaceRegex(re, s, p.Content) }}, nil
	case "NFC":
		return []normalizer{norm.NFC.String}, nil
	case "NFD":
		return []normalizer{norm.NFD.String}, nil
	case "NFKC":
		return []normalizer{norm.NFKC.String}, nil
	case "NFKD":
		return []normalizer{norm.NFKD.String}, nil
	case "Lowercase":
		return []normalizer{strings.ToLower}, nil
	}
	return nil, fmt.Errorf("%s.type %q is not supported (supported: Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase)", field, typ)
}

func replaceRegex(re *regexp2.Regexp, s, with string) string {
	var b strings.Builder
	last := 0
	for _, m := range matches(re, s) {
		b.WriteString(s[last:m[0]])
		b.WriteString(with)
		last = m[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// --- pre-tokenizers ---

// preTokenizer splits each piece further; atStart says whether the first
// piece begins the input (Metaspace's prepend_scheme "first").
type preTokenizer func(pieces []string, atStart bool) []string

// preResult reports what the pre-tokenizers imply for the rest.
type preResult struct {
	steps     []preTokenizer
	byteLevel bool // a ByteLevel step maps bytes to the characters of the vocabulary
}

func parsePreTokenizer(raw json.RawMessage, field string, res *preResult) error {
	typ, null, err := stepType(raw, field)
	if null || err != nil {
		return err
	}
	switch typ {
	case "Sequence":
		_, err := parseSequence(raw, field, "pretokenizers", func(r json.RawMessage, f string) ([]struct{}, error) {
			return nil, parsePreTokenizer(r, f, res)
		})
		return err
	case "ByteLevel":
		p := struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}{}
		if err := json.Unmarshal(raw, &p); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		var re *regexp2.Regexp
		if p.UseRegex == nil || *p.UseRegex {
			var err error
			if re, err = compileRegex(gpt2Pattern); err != nil {
				return fmt.Errorf("%s: %w", field, err)
			}
		}
		res.byteLevel = true
		res.steps = append(res.steps, func(pieces []string, _ bool) []string {
			var out []string
			for _, s := range pieces {
				if p.AddPrefixSpace && !strings.HasPrefix(s, " ") {
					s = " " + s
				}
				sub := []string{s}
				if re != nil {
					sub = split(s, matches(re, s), "Isolated", false)
				}
				for _, x := range sub {
					out = append(out, toByteLevel(x))
				}
			}
			return out
		})
		return nil
	case "Split":
		var p struct {
			Pattern  pattern `json:"pattern"`
			Behavior string  `json:"behavior"`
			Invert   bool    `json:"invert"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		if !validBehavior(p.Behavior) {
			return fmt.Errorf("%s.behavior %q is not supported (supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)", field, p.Behavior)
		}
		re, err := p.Pattern.compile(field + ".pattern")
		if err != nil {
			return err
		}
		res.steps = append(res.steps, eachPiece(func(s string) []string {
			return split(s, matches(re, s), p.Behavior, p.Invert)
		}))
		return nil
	case "Digits":
		var p struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		behavior := "Contiguous"
		if p.Individual {
			behavior = "Isolated"
		}
		res.steps = append(res.steps, eachPiece(func(s string) []string {
			var spans [][]int
			for i, r := range s {
				if unicode.IsNumber(r) {
					spans = append(spans, []int{i, i + utf8.RuneLen(r)})
				}
			}
			return split(s, spans, behavior, false)
		}))
		return nil
	case "Metaspace":
		p := struct {
			Replacement   string `json:"replacement"`
			PrependScheme string `json:"prepend_scheme"`
			AddPrefix     *bool  `json:"add_prefix_space"`
			Split         *bool  `json:"split"`
		}{Replacement: "▁", PrependScheme: "always"}
		if err := json.Unmarshal(raw, &p); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		if p.AddPrefix != nil && !*p.AddPrefix { // the older field
			p.PrependScheme = "never"
		}
		doSplit := p.Split == nil || *p.Split
		res.steps = append(res.steps, func(pieces []string, atStart bool) []string {
			var out []string
			for i, s := range pieces {
				s = strings.ReplaceAll(s, " ", p.Replacement)
				first := atStart && i == 0
				if (p.PrependScheme == "always" || (p.PrependScheme == "first" && first)) && !strings.HasPrefix(s, p.Replacement) {
					s = p.Replacement + s
				}
				if !doSplit {
					out = append(out, s)
					continue
				}
				var spans [][]int
				for j := 0; ; {
					k := strings.Index(s[j:], p.Replacement)
					if k < 0 {
						break
					}
					spans = append(spans, []int{j + k, j + k + len(p.Replacement)})
					j += k + len(p.Replacement)
				}
				out = append(out, split(s, spans, "MergedWithNext", false)...)
			}
			return out
		})
		return nil
	}
	return fmt.Errorf("%s.type %q is not supported (supported: Sequence, ByteLevel, Split, Digits, Metaspace)", field, typ)
}

func eachPiece(f func(string) []string) preTokenizer {
	return func(pieces []string, _ bool) []string {
		var out []string
		for _, s := range pieces {
			out = append(out, f(s)...)
		}
		return out
	}
}

func validBehavior(b string) bool {
	switch b {
	case "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous":
		return true
	}
	return false
}

// split cuts s at the spans (sorted, disjoint byte ranges of the matches)
// as the library's SplitDelimiterBehavior says; invert swaps the roles of
// matches and the text between them. Empty pieces are dropped.
func split(s string, spans [][]int, behavior string, invert bool) []string {
	type part struct {
		lo, hi int
		match  bool
	}
	var parts []part
	last := 0
	for _, m := range spans {
		if m[0] > last {
			parts = append(parts, part{last, m[0], false})
		}
		if m[1] > m[0] {
			parts = append(parts, part{m[0], m[1], true})
		}
		last = m[1]
	}
	if last < len(s) {
		parts = append(parts, part{last, len(s), false})
	}
	if invert {
		for i := range parts {
			parts[i].match = !parts[i].match
		}
	}
	var out []string
	switch behavior {
	case "Removed":
		for _, p := range parts {
			if !p.match {
				out = append(out, s[p.lo:p.hi])
			}
		}
	case "Isolated":
		for _, p := range parts {
			out = append(out, s[p.lo:p.hi])
		}
	case "MergedWithPrevious":
		for i, p := range parts {
			if p.match && i > 0 && !parts[i-1].match {
				out[len(out)-1] += s[p.lo:p.hi]
				continue
			}
			out = append(out, s[p.lo:p.hi])
		}
	case "MergedWithNext":
		pending := ""
		for _, p := range parts {
			if p.match {
				if pending != "" {
					out = append(out, pending)
				}
				pending = s[p.lo:p.hi]
				continue
			}
			out = append(out, pending+s[p.lo:p.hi])
			pending = ""
		}
		if pending != "" {
			out = append(out, pending)
		}
	case "Contiguous":
		for i, p := range parts {
			if p.match && i > 0 && parts[i-1].match {
				out[len(out)-1] += s[p.lo:p.hi]
				continue
			}
			out = append(out, s[p.lo:p.hi])
		}
	}
	return out
}

// --- the byte-level alphabet ---

// byteChar maps each byte to the character GPT-2's byte-level BPE writes
// it as (printable Latin-1 stays; the rest moves to U+0100 and up), and
// charByte is its inverse.
var byteChar, charByte = func() ([256]rune, map[rune]byte) {
	var bc [256]rune
	cb := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			bc[b] = rune(b)
		} else {
			bc[b] = rune(256 + n)
			n++
		}
		cb[bc[b]] = byte(b)
	}
	return bc, cb
}()

func toByteLevel(s string) string {
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteRune(byteChar[s[i]])
	}
	return b.String()
}

// --- decoders ---

// decoder rewrites the token strings, as the library's decode_chain does.
type decoder func(tokens []string) []string

func parseDecoder(raw json.RawMessage, field string) ([]decoder, error) {
	typ, null, err := stepType(raw, field)
	if null || err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		return parseSequence(raw, field, "decoders", parseDecoder)
	case "ByteLevel":
		return []decoder{decodeByteLevel}, nil
	case "Replace":
		var p replaceArgs
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		if p.Pattern.String == nil {
			return nil, fmt.Errorf("%s.pattern: only a String pattern is supported", field)
		}
		old := *p.Pattern.String
		return []decoder{func(toks []string) []string {
			for i, s := range toks {
				toks[i] = strings.ReplaceAll(s, old, p.Content)
			}
			return toks
		}}, nil
	case "ByteFallback":
		return []decoder{decodeByteFallback}, nil
	case "Fuse":
		return []decoder{func(toks []string) []string { return []string{strings.Join(toks, "")} }}, nil
	case "Strip":
		var p struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		c, _ := utf8.DecodeRuneInString(p.Content)
		return []decoder{func(toks []string) []string {
			for i, s := range toks {
				for k := 0; k < p.Start && strings.HasPrefix(s, string(c)); k++ {
					s = s[utf8.RuneLen(c):]
				}
				for k := 0; k < p.Stop && strings.HasSuffix(s, string(c)); k++ {
					s = s[:len(s)-utf8.RuneLen(c)]
				}
				toks[i] = s
			}
			return toks
		}}, nil
	case "Metaspace":
		p := struct {
			Replacement   string `json:"replacement"`
			PrependScheme string `json:"prepend_scheme"`
			AddPrefix     *bool  `json:"add_prefix_space"`
		}{Replacement: "▁", PrependScheme: "always"}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		if p.AddPrefix != nil && !*p.AddPrefix {
			p.PrependScheme = "never"
		}
		return []decoder{func(toks []string) []string {
			for i, s := range toks {
				s = strings.ReplaceAll(s, p.Replacement, " ")
				if i == 0 && p.PrependScheme != "never" {
					s = strings.TrimPrefix(s, " ")
				}
				toks[i] = s
			}
			return toks
		}}, nil
	}
	return nil, fmt.Errorf("%s.type %q is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)", field, typ)
}

// decodeByteLevel maps each token's characters back to bytes; a token with
// a character outside the byte alphabet (an added token) keeps its text.
// Unlike the library, which replaces invalid UTF-8 with U+FFFD, the bytes
// stay as they are, so that ids cutting a character still join up.
func decodeByteLevel(toks []string) []string {
	var b []byte
	for _, t := range toks {
		start := len(b)
		ok := true
		for _, r := range t {
			c, in := charByte[r]
			if !in {
				ok = false
				break
			}
			b = append(b, c)
		}
		if !ok {
			b = append(b[:start], t...)
		}
	}
	return []string{string(b)}
}

// decodeByteFallback turns runs of <0xNN> tokens into their bytes: the text
// they spell when it is valid UTF-8, else one U+FFFD per token.
func decodeByteFallback(toks []string) []string {
	var out []string
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range toks {
		if b, ok := byteToken(t); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// byteToken reads a "<0xNN>" token.
func byteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	var b byte
	for _, c := range t[3:5] {
		var v byte
		switch {
		case '0' <= c && c <= '9':
			v = byte(c - '0')
		case 'A' <= c && c <= 'F':
			v = byte(c-'A') + 10
		case 'a' <= c && c <= 'f':
			v = byte(c-'a') + 10
		default:
			return 0, false
		}
		b = b<<4 | v
	}
	return b, true
}

// parseSequence parses the list under key of a "Sequence" step, each
// element by parse (named field.key[i] in errors), in order.
func parseSequence[T any](raw json.RawMessage, field, key string, parse func(json.RawMessage, string) ([]T, error)) ([]T, error) {
	var s map[string]json.RawMessage
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(s[key], &items); err != nil && !isNull(s[key]) {
		return nil, fmt.Errorf("%s.%s: %w", field, key, err)
	}
	var out []T
	for i, r := range items {
		v, err := parse(r, fmt.Sprintf("%s.%s[%d]", field, key, i))
		if err != nil {
			return nil, err
		}
		out = append(out, v...)
	}
	return out, nil
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
