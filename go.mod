module github.com/lsp-offload/lsp-offload

go 1.26.0

require (
	github.com/ardanlabs/jinja v1.8.0
	github.com/barnex/cuda5 v0.0.0-20171012184954-da30a9b287d8
	github.com/dlclark/regexp2/v2 v2.5.1
	github.com/klauspost/cpuid/v2 v2.4.2
	github.com/tiktoken-go/tokenizer v0.10.0
	golang.org/x/image v0.30.0
	golang.org/x/sys v0.49.0
	golang.org/x/term v0.47.0
	golang.org/x/text v0.28.0
	gonum.org/v1/plot v0.17.0
	google.golang.org/protobuf v1.36.12
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
)
