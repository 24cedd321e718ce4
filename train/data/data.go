// Package data turns training data into token sequences and batches: the
// builtin synthetic tasks, instruction and chat files (JSON or JSONL: Alpaca
// records, OpenAI-style messages or ShareGPT conversations, told apart by
// their content) and plain text; it splits off an eval set and serves
// next-token batches in a seeded shuffled order that a checkpoint can resume
// exactly.
//
// An instruction example is Encode(Prompt) ++ Encode(Response) ++ [EOS], and
// loss is taken only on the response and the EOS; a conversation (chat.go)
// takes loss on every assistant turn and its end-of-turn token only, rendered
// with the checkpoint's chat template (train/chattmpl) or, without one, a
// fixed ChatML-like format; plain text is cut into windows where every token
// is a target. Limits: every file is read whole into memory; examples that do
// not fit the sequence length are dropped or cut, never packed several to a
// row.
package data

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/lsp-offload/lsp-offload/train/chattmpl"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// Record is one instruction example, already rendered with its template:
// exact match generates from the prompt and compares with the response.
// For a conversation, Response is its last assistant turn and Prompt the
// text before it, for grouping the split and for logs: the chat
// template's rendering up to the generation prompt, or in the fixed
// format the turns with each EOS that ends one written as <|im_end|>;
// the tokens generated from are Dataset.EvalPrompts', since in the fixed
// format no text stands for those EOS ids.
type Record struct{ Prompt, Response string }

// Example is a tokenized record: Tokens = tokenizer.Prefix (the BOS of a
// tokenizer that adds one) ++ Encode(Prompt) ++ Encode(Response) ++ [EOS]
// (cut short if truncated), and the first PromptLen tokens are the
// prompt, which takes no loss. A plain-text window has PromptLen 0 and no
// EOS. Tokens may share memory with other examples: treat it as read-only.
//
// Spans generalises PromptLen to several stretches of targets (a
// conversation's assistant turns): when not nil, token j is a target
// exactly when it lies in one of the spans, and PromptLen is the first
// span's Start. Nil means the one span [PromptLen, len(Tokens)), which is
// every instruction example and text window (TargetSpans).
type Example struct {
	Tokens    []int32
	PromptLen int
	Spans     []Span
}

// Span is a stretch [Start, End) of an example's tokens that are targets.
type Span struct{ Start, End int }

// TargetSpans returns the spans of ex's tokens that are targets: Spans, or
// the one span from PromptLen to the end.
func (ex Example) TargetSpans() []Span {
	if ex.Spans != nil {
		return ex.Spans
	}
	return []Span{{ex.PromptLen, len(ex.Tokens)}}
}

// Options controls how records become examples.
type Options struct {
	// SeqLen is T, the model's input length: an example fits when
	// len(Tokens) <= T+1 (inputs are Tokens[:L-1], targets Tokens[1:]).
	SeqLen int
	// Truncate cuts over-long examples to T+1 tokens when at least one
	// response token survives (otherwise they are dropped); false drops every
	// over-long example. Dropped and Truncated count them.
	Truncate bool
	// EvalFraction is the share of examples held out for eval, in [0, 1).
	// Above 0 with at least two examples, eval gets at least one and train
	// keeps at least one; 0 holds out nothing.
	EvalFraction float64
	// Seed drives the builtin tasks and the train/eval split.
	Seed uint64
	// Chat is the chat template conversations are rendered with (the
	// checkpoint's chat_template, or --chat-template); nil renders them
	// in the fixed format (chat.go). ChatErr, when not nil, is why the
	// template could not be read: loading conversations fails with it,
	// other data needs no template and loads.
	Chat    *chattmpl.Template
	ChatErr error

	// allEval puts every example into Eval (LoadEval).
	allEval bool
}

func (o Options) validate() error {
	if o.SeqLen < 1 {
		return fmt.Errorf("data: sequence length %d, want at least 1", o.SeqLen)
	}
	if !(o.EvalFraction >= 0 && o.EvalFraction < 1) { // also rejects NaN
		return fmt.Errorf("data: eval fraction %v, want a value in [0, 1)", o.EvalFraction)
	}
	return nil
}

// Dataset is loaded, tokenized and split data.
type Dataset struct {
	Train, Eval []Example
	// EvalRecords are the records behind Eval, in the same order, for
	// exact-match eval by generation (untruncated). Empty for plain text.
	EvalRecords []Record
	// EvalPrompts, when not nil (conversations), are the tokens exact
	// match generates each of EvalRecords from, Prefix included; nil
	// means Prefix ++ Encode(Prompt) (PromptTokens).
	EvalPrompts [][]int32
	// Dropped counts examples left out for length; Truncated those cut.
	Dropped, Truncated int
	// Lengths are the token counts of every example as encoded, before
	// any was dropped or cut, in record order, so a caller can say which
	// sequence length would keep them (SeqLenKeeping). Nil for plain
	// text, whose windows are cut to fit.
	Lengths []int
	// Source says what was loaded, for logs.
	Source string
	// Rendering says how conversations were rendered, for logs: the
	// chat template's name, or the fixed format; "" for other data.
	Rendering string
}

// Load reads the data at path: "builtin" (the DefaultBuiltinTask),
// "builtin:TASK" or "builtin:TASK:N" (N records, default DefaultBuiltinN),
// a JSON or JSONL file (extension .json or .jsonl, any case) of Alpaca
// records, OpenAI-style messages or ShareGPT conversations (the first
// record's fields say which: parseRecords), or any other file as plain
// text.
func Load(path string, tok tokenizer.Tokenizer, opt Options) (*Dataset, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, fmt.Errorf("data: load %s: no tokenizer", path)
	}
	if isBuiltin(path) {
		return loadBuiltin(path, tok, opt)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("data: %s is empty", path)
	}
	if isAlpaca(path) {
		items, format, kind, err := parseRecords(path, raw)
		if err != nil {
			return nil, err
		}
		ds, err := fromItems(items, tok, opt)
		if err != nil {
			return nil, fmt.Errorf("data: %s: %w", path, err)
		}
		ds.Source = fmt.Sprintf("%s %s %s (%d records)", format, kind, path, len(items))
		return ds, nil
	}
	return fromText(path, raw, tok, opt)
}

// LoadEval reads the data at path as Load does, but as a held-out set of
// its own (--eval-data): every example kept goes to Eval, its record to
// EvalRecords; Train is empty. opt.EvalFraction must be 0.
func LoadEval(path string, tok tokenizer.Tokenizer, opt Options) (*Dataset, error) {
	if opt.EvalFraction != 0 {
		return nil, fmt.Errorf("data: eval set %s: eval fraction %v, want 0: the whole file is held out", path, opt.EvalFraction)
	}
	opt.allEval = true
	return Load(path, tok, opt)
}

// isBuiltin says whether path names a built-in task.
func isBuiltin(path string) bool { return path == "builtin" || strings.HasPrefix(path, "builtin:") }

// isAlpaca says whether path is read as a JSON or JSONL file of records
// (by its extension): Alpaca, messages or ShareGPT.
func isAlpaca(path string) bool {
	ext := strings.ToLower(filepath.Ext(path))
	return ext == ".json" || ext == ".jsonl"
}

// HasRecords says whether the data at path is prompt-response records (a
// built-in task, an Alpaca file or conversations), which exact match can
// score, rather than plain text.
func HasRecords(path string) bool { return isBuiltin(path) || isAlpaca(path) }

// loadBuiltin parses "builtin[:TASK[:N]]" and generates the records.
func loadBuiltin(path string, tok tokenizer.Tokenizer, opt Options) (*Dataset, error) {
	parts := strings.Split(path, ":")
	task, n := DefaultBuiltinTask, DefaultBuiltinN
	if len(parts) > 3 {
		return nil, fmt.Errorf("data: %q: want builtin, builtin:TASK or builtin:TASK:N", path)
	}
	if len(parts) >= 2 {
		task = parts[1]
	}
	if len(parts) == 3 {
		v, err := strconv.Atoi(parts[2])
		if err != nil || v < 1 {
			return nil, fmt.Errorf("data: %q: record count %q is not a positive integer", path, parts[2])
		}
		n = v
	}
	recs, err := Builtin(task, n, opt.Seed)
	if err != nil {
		return nil, err
	}
	ds, err := fromRecords(recs, tok, opt)
	if err != nil {
		return nil, fmt.Errorf("data: builtin:%s: %w", task, err)
	}
	ds.Source = fmt.Sprintf("builtin:%s (%d records, seed %d)", task, n, opt.Seed)
	return ds, nil
}

// FromRecords tokenizes records, drops or truncates those longer than
// SeqLen+1 tokens, and splits the rest into train and eval so that records
// with the same prompt always land on the same side. Train and Eval keep the
// records' order.
func FromRecords(recs []Record, tok tokenizer.Tokenizer, opt Options) (*Dataset, error) {
	if err := opt.validate(); err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, fmt.Errorf("data: no tokenizer")
	}
	ds, err := fromRecords(recs, tok, opt)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	return ds, nil
}

// fromRecords is FromRecords with checked options; its errors leave the
// "data:" prefix to the caller, which adds the source's name.
func fromRecords(recs []Record, tok tokenizer.Tokenizer, opt Options) (*Dataset, error) {
	for i, r := range recs {
		if r.Prompt == "" && r.Response == "" {
			return nil, fmt.Errorf("record %d has an empty prompt and response", i)
		}
	}
	items := make([]item, len(recs))
	for i, r := range recs {
		items[i].rec = r
	}
	return fromItems(items, tok, opt)
}

// item is one record of the data: an instruction record, or a
// conversation (conv not nil), whose rec and prompt its encoding fills in
// (encodeConversation).
type item struct {
	rec    Record
	conv   []Turn
	prompt []int32
}

// fromItems is fromRecords for records and conversations alike.
func fromItems(recs []item, tok tokenizer.Tokenizer, opt Options) (*Dataset, error) {
	if len(recs) == 0 {
		return nil, fmt.Errorf("no records")
	}
	all, rendering, err := encodeAll(recs, tok, opt)
	if err != nil {
		return nil, err
	}
	maxLen := opt.SeqLen + 1
	ds := &Dataset{Source: fmt.Sprintf("records (%d)", len(recs)), Lengths: make([]int, len(all)), Rendering: rendering}
	for i := range all {
		ds.Lengths[i] = len(all[i].Tokens)
	}
	var keep []int
	longest := 0
	for i := range all {
		ex := &all[i]
		L := len(ex.Tokens)
		if L <= maxLen {
			keep = append(keep, i)
			continue
		}
		longest = max(longest, L)
		// PromptLen <= T keeps Tokens[PromptLen], the first response token
		// (or the EOS of an empty response), as a target.
		if opt.Truncate && ex.PromptLen <= opt.SeqLen {
			ex.Tokens = ex.Tokens[:maxLen:maxLen]
			ex.Spans = clipSpans(ex.Spans, maxLen)
			ds.Truncated++
			keep = append(keep, i)
			continue
		}
		ds.Dropped++
	}
	if len(keep) == 0 {
		how := "longer than"
		if opt.Truncate {
			how = "with prompts of at least"
		}
		return nil, fmt.Errorf("all %d examples dropped: %d are %s %d tokens (sequence length %d + 1; the longest has %d tokens)",
			len(recs), ds.Dropped, how, maxLen, opt.SeqLen, longest)
	}
	prompts := make([]string, len(keep))
	for j, i := range keep {
		prompts[j] = recs[i].rec.Prompt
	}
	inEval := splitByPrompt(prompts, opt.EvalFraction, opt.Seed)
	if opt.allEval {
		for j := range inEval {
			inEval[j] = true
		}
	}
	for j, i := range keep {
		if inEval[j] {
			ds.Eval = append(ds.Eval, all[i])
			ds.EvalRecords = append(ds.EvalRecords, recs[i].rec)
			if recs[i].conv != nil {
				ds.EvalPrompts = append(ds.EvalPrompts, recs[i].prompt)
			}
		} else {
			ds.Train = append(ds.Train, all[i])
		}
	}
	return ds, nil
}

// SeqLenKeeping returns the smallest sequence length that keeps the share
// (in (0, 1]) of examples of these token counts whole (an example of L
// tokens needs L-1), or 0 for no examples.
func SeqLenKeeping(lengths []int, share float64) int {
	if len(lengths) == 0 {
		return 0
	}
	s := slices.Clone(lengths)
	slices.Sort(s)
	k := int(math.Ceil(share*float64(len(s)) - 1e-9)) // examples to keep
	k = min(max(k, 1), len(s))
	return max(s[k-1]-1, 1)
}

// ShareKept returns the share of examples of these token counts that a
// sequence length of seqLen keeps whole.
func ShareKept(lengths []int, seqLen int) float64 {
	if len(lengths) == 0 {
		return 0
	}
	n := 0
	for _, L := range lengths {
		if L <= seqLen+1 {
			n++
		}
	}
	return float64(n) / float64(len(lengths))
}

// encodeAll tokenizes the records on all cores; the output order is the
// input order whatever the scheduling. Conversations are rendered with
// opt.Chat when there is one; rendering names how (FixedRendering, or the
// template), "" when there is no conversation. The error is the first
// record's (in record order) whose template rendering failed.
func encodeAll(recs []item, tok tokenizer.Tokenizer, opt Options) ([]Example, string, error) {
	rendering := ""
	if len(recs) > 0 && recs[0].conv != nil {
		if opt.ChatErr != nil {
			return nil, "", opt.ChatErr
		}
		rendering = FixedRendering
		if opt.Chat != nil {
			rendering = "chat template " + opt.Chat.Name
		}
	}
	out := make([]Example, len(recs))
	errs := make([]error, len(recs))
	const chunk = 64
	var next atomic.Int64
	var wg sync.WaitGroup
	workers := min(runtime.GOMAXPROCS(0), (len(recs)+chunk-1)/chunk)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := int(next.Add(chunk)) - chunk
				if lo >= len(recs) {
					return
				}
				for i := lo; i < min(lo+chunk, len(recs)); i++ {
					switch {
					case recs[i].conv != nil && opt.Chat != nil:
						out[i], recs[i].rec, recs[i].prompt, errs[i] = encodeTemplated(recs[i].conv, tok, opt.Chat)
						if errs[i] != nil {
							errs[i] = fmt.Errorf("record %d: %w", i, errs[i])
						}
					case recs[i].conv != nil:
						out[i], recs[i].rec, recs[i].prompt = encodeConversation(recs[i].conv, tok)
					default:
						out[i] = encodeRecord(recs[i].rec, tok)
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, "", err
		}
	}
	return out, rendering, nil
}

func encodeRecord(r Record, tok tokenizer.Tokenizer) Example {
	p := append(tokenizer.Prefix(tok), tok.Encode(r.Prompt)...)
	q := tok.Encode(r.Response)
	t := make([]int32, 0, len(p)+len(q)+1)
	t = append(append(append(t, p...), q...), tok.EOS())
	return Example{Tokens: t, PromptLen: len(p)}
}

// PromptTokens returns the tokens exact match generates eval record i of
// ds from: EvalPrompts[i], or Prefix ++ Encode(Prompt).
func (ds *Dataset) PromptTokens(i int, tok tokenizer.Tokenizer) []int32 {
	if ds.EvalPrompts != nil {
		return ds.EvalPrompts[i]
	}
	return append(tokenizer.Prefix(tok), tok.Encode(ds.EvalRecords[i].Prompt)...)
}

// clipSpans cuts target spans to the first n tokens (nil stays nil: its
// one span follows the tokens).
func clipSpans(spans []Span, n int) []Span {
	if spans == nil {
		return nil
	}
	out := make([]Span, 0, len(spans))
	for _, s := range spans {
		if s.Start < n {
			out = append(out, Span{s.Start, min(s.End, n)})
		}
	}
	return out
}

// evalCount is the number of eval examples out of n for a fraction: the
// rounded share, at least one and at most n-1 when frac > 0 and n >= 2.
func evalCount(n int, frac float64) int {
	if frac <= 0 || n < 2 {
		return 0
	}
	k := int(math.Round(frac * float64(n)))
	return min(max(k, 1), n-1)
}

// splitByPrompt marks the examples held out for eval. Examples are grouped
// by prompt and whole groups, in a seeded random order, go to eval until it
// holds evalCount examples, so no prompt is in both sets; a group that would
// empty train is skipped. Eval can hold a few more than evalCount when
// groups are larger than one, or fewer when one group holds nearly all.
func splitByPrompt(prompts []string, frac float64, seed uint64) []bool {
	n := len(prompts)
	inEval := make([]bool, n)
	k := evalCount(n, frac)
	if k == 0 {
		return inEval
	}
	groupOf := make(map[string]int, n)
	var groups [][]int
	for i, p := range prompts {
		g, ok := groupOf[p]
		if !ok {
			g = len(groups)
			groupOf[p] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	taken := 0
	for _, g := range newRNG(seed, streamOf("split")).perm(len(groups)) {
		if taken >= k {
			break
		}
		if n-taken-len(groups[g]) < 1 {
			continue
		}
		for _, i := range groups[g] {
			inEval[i] = true
		}
		taken += len(groups[g])
	}
	return inEval
}
