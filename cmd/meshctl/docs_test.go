package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/cli"
	"github.com/meshagent/meshagent/pkg/flagenv"
)

// The pages a user reads: the README and docs/, from the repository's root.
func docPages(t *testing.T) map[string]string {
	t.Helper()
	root := filepath.Join("..", "..")
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	pages := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pages[filepath.Clean(f)] = string(b)
	}
	if len(pages) < 5 {
		t.Fatalf("found only %d pages under %s", len(pages), root)
	}
	return pages
}

var (
	fence     = regexp.MustCompile("(?s)```.*?```")
	heading   = regexp.MustCompile(`(?m)^#+\s+(.*)$`)
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	notInSlug = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// slug is the anchor a Markdown renderer gives a heading: lower case, punctuation
// dropped, spaces as hyphens.
func slug(h string) string {
	return strings.ReplaceAll(notInSlug.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
}

// TestDocLinksResolve: every relative link in the README and docs/ names a file
// that exists and, with a #fragment, a heading of that page.
func TestDocLinksResolve(t *testing.T) {
	pages := docPages(t)
	anchors := map[string]map[string]bool{}
	for f, text := range pages {
		anchors[f] = map[string]bool{}
		for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			anchors[f][slug(m[1])] = true
		}
	}
	checked := 0
	for f, text := range pages {
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(link, "#")
			target := f
			if path != "" {
				target = filepath.Clean(filepath.Join(filepath.Dir(f), path))
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s links to %s: no such file", f, link)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(target, ".md") && !anchors[target][frag] {
				t.Errorf("%s links to %s: %s has no heading with anchor #%s", f, link, target, frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no links checked")
	}
}

var (
	codeSpan    = regexp.MustCompile("`([^`\n]+)`")
	meshctlCall = regexp.MustCompile(`meshctl\s+([a-z][a-z-]*)((?:\s+[^\s|;#&<>` + "`" + `]+)*)`)
	flagWord    = regexp.MustCompile(`(?:^|\s)-([a-z][a-z0-9-]*)`)
)

// TestDocsNameOnlyFlagsMeshctlHas: every `meshctl CMD [SUB] -flag` the README and
// docs/ show (in code spans and code blocks) names a flag that command's -h lists.
func TestDocsNameOnlyFlagsMeshctlHas(t *testing.T) {
	help := map[string]string{}
	usage := func(args ...string) string {
		key := strings.Join(args, " ")
		if h, ok := help[key]; ok {
			return h
		}
		var out, errb bytes.Buffer
		err := cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}, append(args, "-h"))
		var b bytes.Buffer
		if !flagenv.PrintHelp(err, &b) {
			b.Reset()
		}
		help[key] = b.String()
		return help[key]
	}
	lists := func(h, flag string) bool {
		return strings.Contains(h, "\n  -"+flag+" ") || strings.Contains(h, "\n  -"+flag+"\n")
	}
	checked := 0
	for f, text := range docPages(t) {
		var snippets []string
		for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
			snippets = append(snippets, m[1])
		}
		for _, block := range fence.FindAllString(text, -1) {
			snippets = append(snippets, strings.Split(block, "\n")...)
		}
		for _, s := range snippets {
			for _, m := range meshctlCall.FindAllStringSubmatch(s, -1) {
				cmd, rest := m[1], strings.Fields(m[2])
				h := usage(cmd)
				if h == "" {
					continue // not a command with flags (or prose: "meshctl is ...")
				}
				// A subcommand (rotate root, bench sign) has flags of its own.
				if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
					if sub := usage(cmd, rest[0]); sub != "" && sub != h {
						h = sub
					}
				}
				for _, fm := range flagWord.FindAllStringSubmatch(m[2], -1) {
					checked++
					if !lists(h, fm[1]) {
						t.Errorf("%s shows `meshctl %s ... -%s`, which meshctl %s -h does not list (in %q)", f, cmd, fm[1], cmd, s)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d flags checked: the docs' meshctl commands were not found", checked)
	}
}
