package doclinks

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, from this package's directory.
const root = "../.."

var (
	// link matches [text](target) and ![alt](target), stopping at the first
	// ')' or space (a title).
	link    = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	fence   = regexp.MustCompile("^\\s*(```|~~~)")
	heading = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	code    = regexp.MustCompile("`[^`]*`")
)

// markdown returns the Markdown files the check covers.
func markdown(t *testing.T) []string {
	files := []string{filepath.Join(root, "README.md")}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append(files, docs...)
}

// slug is the anchor GitHub gives a heading: lower case, punctuation other
// than hyphens and underscores dropped, spaces made hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of the headings of a Markdown file, with the
// -1, -2 … GitHub adds to repeated ones.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		m := heading.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		s := slug(strings.NewReplacer("`", "", "*", "", "[", "", "]", "").Replace(m[2]))
		if n := seen[s]; n > 0 {
			out[s+"-"+itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func itoa(n int) string {
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// links returns the link targets of a Markdown file, outside code, with the
// line each is on.
func links(text string) (targets []string, lines []int) {
	inFence := false
	for i, line := range strings.Split(text, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(code.ReplaceAllString(line, ""), -1) {
			targets = append(targets, m[1])
			lines = append(lines, i+1)
		}
	}
	return targets, lines
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Results on an NVIDIA H200 (CUDA driver)": "results-on-an-nvidia-h200-cuda-driver",
		"`arena.New`: what it checks":             "arenanew-what-it-checks",
		"Fresh memory":                            "fresh-memory",
		"Set up":                                  "set-up",
	} {
		if got := slug(strings.ReplaceAll(h, "`", "")); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
	a := anchors("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n")
	for _, want := range []string{"a", "notes", "notes-1"} {
		if !a[want] {
			t.Errorf("anchors lack %q: %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a line in a code block is no heading")
	}
	got, _ := links("see [x](a.md#b) and `[y](nope.md)`\n```\n[z](in-code.md)\n```\n![p](img.png \"t\")")
	if strings.Join(got, " ") != "a.md#b img.png" {
		t.Errorf("links = %q", got)
	}
}

// TestLinks resolves every relative link and anchor of README.md and docs/.
func TestLinks(t *testing.T) {
	texts := map[string]string{}
	for _, f := range markdown(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts[filepath.Clean(f)] = string(b)
	}
	checked := 0
	for f, text := range texts {
		targets, lines := links(text)
		for i, target := range targets {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue // not checked: no network
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Clean(filepath.Join(filepath.Dir(f), path))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link %q: %v", f, lines[i], target, err)
					continue
				}
			}
			checked++
			if frag == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			destText, ok := texts[dest]
			if !ok {
				b, err := os.ReadFile(dest)
				if err != nil {
					t.Errorf("%s:%d: link %q: %v", f, lines[i], target, err)
					continue
				}
				destText = string(b)
			}
			if !anchors(destText)[frag] {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", f, lines[i], target, dest, frag)
			}
		}
	}
	t.Logf("%d relative links in %d files resolved", checked, len(texts))
}
