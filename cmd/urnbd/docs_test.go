package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// helpOf is what "urnbd PATH... --help" prints.
func helpOf(t *testing.T, path []string) string {
	t.Helper()
	var out bytes.Buffer
	app := newApp()
	app.Writer, app.ErrWriter = &out, &out
	if err := app.Run(append(append([]string{"urnbd"}, path...), "--help")); err != nil {
		t.Fatalf("urnbd %s --help: %v", strings.Join(path, " "), err)
	}
	return out.String()
}

var (
	helpFlag = regexp.MustCompile(`(?m)^ {3}(--?[a-z0-9][a-z0-9-]*)`)
	manFlag  = regexp.MustCompile(`(?m)^\\fB(\\-\\-?[a-z0-9][a-z0-9\\-]*)\\fR`)
)

// helpFlags are the first names of the flags in --help's OPTIONS, help
// itself left out.
func helpFlags(help string) []string {
	i := strings.Index(help, "OPTIONS:")
	if i < 0 {
		return nil
	}
	var out []string
	for _, m := range helpFlag.FindAllStringSubmatch(help[i:], -1) {
		if m[1] != "--help" {
			out = append(out, m[1])
		}
	}
	sort.Strings(out)
	return out
}

func manFlags(page string) []string {
	i := strings.Index(page, ".SH OPTIONS")
	if i < 0 {
		return nil
	}
	var out []string
	for _, m := range manFlag.FindAllStringSubmatch(page[i:], -1) {
		out = append(out, strings.ReplaceAll(m[1], `\-`, "-"))
	}
	sort.Strings(out)
	return out
}

// Every command has a page, and the page names the flags, the usage and
// the arguments that its --help shows: both come from one definition.
func TestManPagesMatchHelp(t *testing.T) {
	dir := t.TempDir()
	if err := writeDocs(newApp(), dir, "test"); err != nil {
		t.Fatal(err)
	}
	cmds := docCommands(newApp())
	if len(cmds) < 40 {
		t.Fatalf("%d commands documented, want every one (more than 40)", len(cmds))
	}
	for _, d := range cmds {
		page, err := os.ReadFile(filepath.Join(dir, "man1", d.manName()+".1"))
		if err != nil {
			t.Errorf("%s: no page: %v", d.line(), err)
			continue
		}
		help := helpOf(t, d.path)
		if got, want := manFlags(string(page)), helpFlags(help); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: page has flags %v, --help %v", d.line(), got, want)
		}
		if !strings.Contains(help, d.cmd.Usage) || !strings.Contains(string(page), roff(d.cmd.Usage)) {
			t.Errorf("%s: usage %q not in both page and --help", d.line(), d.cmd.Usage)
		}
		if a := d.cmd.ArgsUsage; a != "" && (!strings.Contains(help, a) || !strings.Contains(string(page), roff(a))) {
			t.Errorf("%s: arguments %q not in both page and --help", d.line(), a)
		}
		if man, err := exec.LookPath("man"); err == nil {
			out, err := exec.Command(man, "--warnings", "-l", "-Tutf8", filepath.Join(dir, "man1", d.manName()+".1")).CombinedOutput()
			if err != nil || bytes.Contains(out, []byte("warning")) {
				t.Errorf("%s: man -l: %v\n%s", d.line(), err, out)
			}
		}
	}
}

// The bash completion offers each command's commands and flags.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash on this machine: the bash completion is not tested here")
	}
	script := writeTemp(t, "urnbd.bash", bashCompletion(newApp()))
	for line, want := range map[string]string{
		"urnbd se":                "server session",
		"urnbd server session ":   "disconnect list show --help",
		"urnbd map --sess":        "--sessname --session-devices",
		"urnbd server --tls-c":    "--tls-cert --tls-client-ca",
		"urnbd server session li": "list",
	} {
		words := strings.Split(line, " ")
		prog := `source "$1"; COMP_WORDS=(` + quoteWords(words) + `); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _urnbd; printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' '`
		out, err := exec.Command(bash, "-c", prog, "bash", script).CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", line, err, out)
		}
		wantSorted := strings.Fields(want)
		sort.Strings(wantSorted)
		if got := strings.TrimSpace(string(out)); got != strings.Join(wantSorted, " ") {
			t.Errorf("completing %q: %q, want %q", line, got, strings.Join(wantSorted, " "))
		}
	}
}

// writeTemp writes text to a file name in a temporary folder of t.
func writeTemp(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func quoteWords(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = "'" + w + "'"
	}
	return strings.Join(q, " ")
}

// The zsh completion is a well-formed zsh function file.
func TestZshCompletionParses(t *testing.T) {
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Skip("no zsh on this machine (apt-get install zsh): the zsh completion's syntax is not checked here")
	}
	script := writeTemp(t, "_urnbd", zshCompletion(newApp()))
	if out, err := exec.Command(zsh, "-n", script).CombinedOutput(); err != nil {
		t.Errorf("zsh -n: %v\n%s", err, out)
	}
}
