// text.go: plain text as training data. The whole file is tokenized as one
// document (no EOS added) and cut into windows of T+1 tokens that overlap by
// one, so every token after the first is a target exactly once; the last
// window may be shorter. The tail windows are the eval set (all of them
// for LoadEval). Limit: the file
// and its tokens are held in memory.

package data

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

func fromText(name string, raw []byte, tok tokenizer.Tokenizer, opt Options) (*Dataset, error) {
	tokens := append(tokenizer.Prefix(tok), tok.Encode(string(raw))...)
	if len(tokens) < 2 {
		return nil, fmt.Errorf("data: %s has %d token(s); plain text needs at least 2", name, len(tokens))
	}
	wins := windows(tokens, opt.SeqLen)
	k := evalCount(len(wins), opt.EvalFraction)
	if opt.allEval {
		k = len(wins)
	}
	return &Dataset{
		Train:  wins[:len(wins)-k],
		Eval:   wins[len(wins)-k:],
		Source: fmt.Sprintf("text %s (%d tokens, %d windows of up to %d)", name, len(tokens), len(wins), opt.SeqLen+1),
	}, nil
}

// windows cuts tokens into examples of at most T+1 tokens starting every T
// tokens. They share the tokens' memory (capacity capped, so an append
// cannot write into a neighbour).
func windows(tokens []int32, T int) []Example {
	var out []Example
	for start := 0; start+1 < len(tokens); start += T {
		end := min(start+T+1, len(tokens))
		out = append(out, Example{Tokens: tokens[start:end:end]})
	}
	return out
}
