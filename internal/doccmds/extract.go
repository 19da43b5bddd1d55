package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// A command is a shell command README.md or a page of docs/ shows: a line
// of a ```sh block, or a code span in the prose that starts like one.
type command struct {
	file string // relative to the repository
	line int
	text string // as a shell reads it: comments dropped, continuations joined, whitespace collapsed
}

func (c command) String() string { return fmt.Sprintf("%s:%d: %s", c.file, c.line, c.text) }

// A problem is Markdown the check refuses: a block of commands that is not
// marked as shell, so that no one would know it must run.
type problem struct {
	file string
	line int
	what string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.file, p.line, p.what) }

var (
	fence = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([^`\\s]*)")
	// looksLikeCommand matches what a reader would type: assignments, then
	// go run/test/build/get…, gcc, mkdir, bash, a script of .ci/ or a binary in
	// the current directory.
	looksLikeCommand = regexp.MustCompile(`^(?:[A-Z][A-Z0-9_]*=\S*\s+)*(?:go\s+(?:run|test|build|vet|install|get|tool|generate|mod)\b|gcc\s|mkdir\s|bash\s|\.ci/\S+|\./[\w.-]+\s+-)`)
	codeSpan         = regexp.MustCompile("(?s)(`+)(.+?)(?:`+)")
	spaces           = regexp.MustCompile(`\s+`)
)

// markdownFiles returns README.md and docs/*.md under root, relative.
func markdownFiles(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			return nil, err
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files, nil
}

// extract returns every command the Markdown files under root show, in
// order, and the problems found on the way.
func extract(root string) ([]command, []problem, error) {
	files, err := markdownFiles(root)
	if err != nil {
		return nil, nil, err
	}
	var cmds []command
	var probs []problem
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, nil, err
		}
		c, p := extractFile(f, string(b))
		cmds = append(cmds, c...)
		probs = append(probs, p...)
	}
	return cmds, probs, nil
}

func extractFile(file, text string) ([]command, []problem) {
	var cmds []command
	var probs []problem
	lines := strings.Split(text, "\n")
	var para []string // prose lines not yet scanned for code spans
	paraStart := 0
	flush := func() {
		if len(para) > 0 {
			cmds = append(cmds, spans(file, paraStart, para)...)
		}
		para = nil
	}
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			if strings.TrimSpace(lines[i]) == "" {
				flush()
				continue
			}
			if len(para) == 0 {
				paraStart = i + 1
			}
			para = append(para, lines[i])
			continue
		}
		flush()
		open, info, start := m[1], m[2], i+1
		var body []string
		for i++; i < len(lines); i++ {
			if strings.HasPrefix(strings.TrimSpace(lines[i]), open) {
				break
			}
			body = append(body, lines[i])
		}
		switch info {
		case "sh":
			cmds = append(cmds, shellLines(file, start+1, body)...)
		case "":
			for j, l := range body {
				if looksLikeCommand.MatchString(strings.TrimSpace(l)) {
					probs = append(probs, problem{file, start + 1 + j,
						fmt.Sprintf("a block without a language holds a command (%q): mark it ```sh, so that it runs in CI", strings.TrimSpace(l))})
					break
				}
			}
		}
	}
	flush()
	return cmds, probs
}

// shellLines returns the commands of the lines of a ```sh block whose first
// line is line first of the file.
func shellLines(file string, first int, body []string) []command {
	var cmds []command
	var cur strings.Builder
	curLine := 0
	for j, l := range body {
		if cur.Len() == 0 {
			curLine = first + j
		}
		l = stripComment(l)
		if cont, ok := strings.CutSuffix(strings.TrimRight(l, " \t"), `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(l)
		if t := normalize(cur.String()); t != "" {
			cmds = append(cmds, command{file, curLine, t})
		}
		cur.Reset()
	}
	return cmds
}

// spans returns the commands among the code spans of a paragraph: those
// that start like one and name what they run.
func spans(file string, first int, para []string) []command {
	var cmds []command
	text := strings.Join(para, "\n")
	for _, m := range codeSpan.FindAllStringSubmatchIndex(text, -1) {
		s := text[m[4]:m[5]]
		line := first + strings.Count(text[:m[0]], "\n")
		if strings.HasPrefix(strings.TrimSpace(para[line-first]), "|") {
			s = strings.ReplaceAll(s, `\|`, "|") // a pipe escaped in a table cell is a pipe
		}
		s = normalize(s)
		// In prose a command names what it runs (a package, a script): a
		// bare "go vet" or "gcc" is a mention.
		if looksLikeCommand.MatchString(s+" ") && (strings.Contains(s, " ./") || strings.Contains(s, ".ci/")) {
			cmds = append(cmds, command{file, line, s})
		}
	}
	return cmds
}

// unquoted calls fn with the index of each byte of s that lies outside
// single and double quotes, until fn returns false.
func unquoted(s string, fn func(i int) bool) {
	var quote byte
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		default:
			if !fn(i) {
				return
			}
		}
	}
}

// stripComment drops a shell comment: a # at the start of the line or after
// a blank, outside quotes.
func stripComment(l string) string {
	end := len(l)
	unquoted(l, func(i int) bool {
		if l[i] == '#' && (i == 0 || l[i-1] == ' ' || l[i-1] == '\t') {
			end = i
			return false
		}
		return true
	})
	return l[:end]
}

func normalize(s string) string { return strings.TrimSpace(spaces.ReplaceAllString(s, " ")) }

// splitShell splits a command line at the ; and && that separate commands,
// outside quotes.
func splitShell(s string) []string {
	var parts []string
	start, skip := 0, -1
	unquoted(s, func(i int) bool {
		switch {
		case i == skip:
		case s[i] == ';':
			parts = append(parts, strings.TrimSpace(s[start:i]))
			start = i + 1
		case s[i] == '&' && i+1 < len(s) && s[i+1] == '&':
			parts = append(parts, strings.TrimSpace(s[start:i]))
			start, skip = i+2, i+1
		}
		return true
	})
	return append(parts, strings.TrimSpace(s[start:]))
}

// words splits a simple command into words as the shell would, for the
// cases the docs use: blanks separate, single and double quotes group and
// are removed.
func words(s string) []string {
	var out []string
	var cur strings.Builder
	var quote byte
	in := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}
