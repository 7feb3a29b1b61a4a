package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// completionOpts are the options of "leasehold completion SHELL". It needs
// no coordinator: the scripts are generated from the command table and the
// commands' flag sets, so they list exactly what this binary accepts.
type completionOpts struct {
	args  []string
	Shell string
}

func (o *completionOpts) flags(*flag.FlagSet, Env) {}

func (o *completionOpts) setArgs(args []string) {
	o.args = args
	if len(args) == 1 {
		o.Shell = args[0]
	}
}

// completionShells maps each supported shell to its script writer.
var completionShells = map[string]func(io.Writer, completionModel) error{
	"bash": writeBashCompletion,
	"zsh":  writeZshCompletion,
	"fish": writeFishCompletion,
}

// Validate checks that exactly one supported shell was named.
func (o *completionOpts) Validate() error {
	if _, ok := completionShells[o.Shell]; len(o.args) != 1 || !ok {
		return usagef("completion takes one shell: bash, zsh or fish")
	}
	return nil
}

func (o *completionOpts) run(_ context.Context, a *app) error {
	return completionShells[o.Shell](a.out, newCompletionModel())
}

// completionFlag is one flag as the scripts offer it.
type completionFlag struct {
	name  string // without dashes
	usage string // one line, without the backquotes of the placeholder
	// arg is the placeholder of a flag that takes a value ("" for a bool flag).
	arg string
	// values are the fixed choices of the value, if any.
	values []string
	// files says the value is a file name.
	files bool
}

// dashed returns the flag as typed: -o for one letter, --name otherwise.
func (f completionFlag) dashed() string {
	if len(f.name) == 1 {
		return "-" + f.name
	}
	return "--" + f.name
}

// completionCommand is one command as the scripts offer it.
type completionCommand struct {
	name, summary string
	flags         []completionFlag
	// args are the fixed choices of the positional arguments, if any.
	args []string
	// files says the positional arguments are files or directories.
	files bool
}

// completionModel is what every script lists.
type completionModel struct {
	globals  []completionFlag
	commands []completionCommand
}

// flagValues are the fixed choices of flags, by name.
var flagValues = map[string][]string{
	"o":               {"table", "json"},
	"output":          {"table", "json"},
	"phase":           {"QUEUED", "LEASED", "RETRY_WAIT", "SUCCEEDED", "FAILED", "CANCELLED"},
	"terminal-reason": {"UNSUPPORTED_FORMAT", "INVALID_DOCUMENT", "ATTEMPTS_EXHAUSTED", "CANCELLED"},
}

// fileFlags take a file name.
var fileFlags = map[string]bool{"f": true, "file": true}

// newCompletionModel reads the command table and every command's flags.
func newCompletionModel() completionModel {
	var m completionModel
	g := newGlobalOpts(Env{})
	gfs := flag.NewFlagSet("leasehold", flag.ContinueOnError)
	g.register(gfs)
	isGlobal := map[string]bool{}
	gfs.VisitAll(func(f *flag.Flag) {
		isGlobal[f.Name] = true
		m.globals = append(m.globals, toCompletionFlag(f))
	})
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	sort.Strings(names)
	for _, c := range commands {
		cc := completionCommand{name: c.name, summary: c.summary}
		var cg globalOpts
		newFlagSet(c, Env{}, c.new(), &cg).VisitAll(func(f *flag.Flag) {
			if !isGlobal[f.Name] {
				cc.flags = append(cc.flags, toCompletionFlag(f))
			}
		})
		switch c.name {
		case "submit":
			cc.files = true
		case "completion":
			cc.args = []string{"bash", "fish", "zsh"}
		}
		m.commands = append(m.commands, cc)
	}
	m.commands = append(m.commands, completionCommand{name: "help", summary: "Show the usage of leasehold or of one command.", args: names})
	sort.Slice(m.commands, func(i, j int) bool { return m.commands[i].name < m.commands[j].name })
	return m
}

func toCompletionFlag(f *flag.Flag) completionFlag {
	arg, usage := flag.UnquoteUsage(f)
	cf := completionFlag{name: f.Name, usage: strings.Join(strings.Fields(usage), " "), values: flagValues[f.Name], files: fileFlags[f.Name]}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
		cf.arg = arg
		if cf.arg == "" {
			cf.arg = "value"
		}
	}
	return cf
}

// commandNames lists the commands, space-separated.
func (m completionModel) commandNames() string {
	var n []string
	for _, c := range m.commands {
		n = append(n, c.name)
	}
	return strings.Join(n, " ")
}

// flagWords lists flags as typed, space-separated; valueOnly keeps those
// that take a value.
func flagWords(flags []completionFlag, valueOnly bool) string {
	var w []string
	for _, f := range flags {
		if !valueOnly || f.arg != "" {
			w = append(w, f.dashed())
		}
	}
	return strings.Join(w, " ")
}

// writeBashCompletion writes a bash script that completes commands, each
// command's flags, the fixed values of flags, and files for submit.
func writeBashCompletion(w io.Writer, m completionModel) error {
	var b strings.Builder
	b.WriteString(`# bash completion for leasehold.
# Load it with:   source <(leasehold completion bash)
# or install it:  leasehold completion bash > ~/.local/share/bash-completion/completions/leasehold

_leasehold() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
`)
	fmt.Fprintf(&b, "    local commands=%q\n", m.commandNames())
	fmt.Fprintf(&b, "    local global_flags=%q\n", flagWords(m.globals, false))
	fmt.Fprintf(&b, "    local global_values=%q\n", " "+flagWords(m.globals, true)+" ")
	b.WriteString(`    local cmd="" i w
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if [[ $w == -* ]]; then
            if [[ $w != *=* && $global_values == *" $w "* ]]; then
                i=$((i + 1))
            fi
            continue
        fi
        cmd=$w
        break
    done
    local flags="" values=" "
    case $cmd in
`)
	for _, c := range m.commands {
		if len(c.flags) == 0 {
			continue
		}
		fmt.Fprintf(&b, "        %s) flags=%q; values=%q ;;\n", c.name, flagWords(c.flags, false), " "+flagWords(c.flags, true)+" ")
	}
	b.WriteString(`    esac
    if [[ "$global_values$values" == *" $prev "* ]]; then
        case $prev in
`)
	seen := map[string]bool{}
	for _, f := range append(append([]completionFlag(nil), m.globals...), allCommandFlags(m)...) {
		if seen[f.dashed()] || (len(f.values) == 0 && !f.files) {
			continue
		}
		seen[f.dashed()] = true
		if f.files {
			fmt.Fprintf(&b, "            %s) COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n", f.dashed())
		} else {
			fmt.Fprintf(&b, "            %s) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", f.dashed(), strings.Join(f.values, " "))
		}
	}
	b.WriteString(`            *) COMPREPLY=() ;;
        esac
        return 0
    fi
    if [[ -z $cmd ]]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "$global_flags" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$commands" -- "$cur"))
        fi
        return 0
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$flags $global_flags" -- "$cur"))
        return 0
    fi
    case $cmd in
`)
	for _, c := range m.commands {
		switch {
		case c.files:
			fmt.Fprintf(&b, "        %s) COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n", c.name)
		case len(c.args) > 0:
			fmt.Fprintf(&b, "        %s) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", c.name, strings.Join(c.args, " "))
		}
	}
	b.WriteString(`    esac
    return 0
}

complete -o default -F _leasehold leasehold
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// allCommandFlags returns every command's flags, in command order.
func allCommandFlags(m completionModel) []completionFlag {
	var all []completionFlag
	for _, c := range m.commands {
		all = append(all, c.flags...)
	}
	return all
}

// zshQuote returns s in single quotes for zsh.
func zshQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// zshSpec is one _arguments spec for f, such as
// --team=[team that owns the batch]:team:
func zshSpec(f completionFlag) string {
	desc := strings.NewReplacer(`\`, `\\`, `[`, `\[`, `]`, `\]`, `:`, `\:`).Replace(f.usage)
	if f.arg == "" {
		return zshQuote(f.dashed() + "[" + desc + "]")
	}
	action := ""
	switch {
	case f.files:
		action = "_files"
	case len(f.values) > 0:
		action = "(" + strings.Join(f.values, " ") + ")"
	}
	return zshQuote(f.dashed() + "=[" + desc + "]:" + strings.ToLower(f.arg) + ":" + action)
}

// writeZshCompletion writes a zsh script: commands with their summaries,
// each command's flags with their descriptions and values, files for submit.
func writeZshCompletion(w io.Writer, m completionModel) error {
	var b strings.Builder
	b.WriteString(`#compdef leasehold
# zsh completion for leasehold.
# Load it with:   source <(leasehold completion zsh)
# or install it:  leasehold completion zsh > "${fpath[1]}/_leasehold"

_leasehold() {
  local curcontext="$curcontext" state line
  local -a commands globals
  commands=(
`)
	for _, c := range m.commands {
		fmt.Fprintf(&b, "    %s\n", zshQuote(c.name+":"+c.summary))
	}
	b.WriteString("  )\n  globals=(\n")
	for _, f := range m.globals {
		fmt.Fprintf(&b, "    %s\n", zshSpec(f))
	}
	b.WriteString(`  )
  _arguments -C $globals '1: :->command' '*:: :->argument'
  case $state in
    command)
      _describe -t commands 'leasehold command' commands
      ;;
    argument)
      case $words[1] in
`)
	for _, c := range m.commands {
		fmt.Fprintf(&b, "        %s)\n          _arguments $globals", c.name)
		for _, f := range c.flags {
			fmt.Fprintf(&b, " \\\n            %s", zshSpec(f))
		}
		switch {
		case c.files:
			b.WriteString(" \\\n            '*:file or directory:_files'")
		case len(c.args) > 0:
			fmt.Fprintf(&b, " \\\n            %s", zshQuote("1:argument:("+strings.Join(c.args, " ")+")"))
		}
		b.WriteString("\n          ;;\n")
	}
	b.WriteString(`      esac
      ;;
  esac
}

if [ "$funcstack[1]" = "_leasehold" ]; then
  _leasehold "$@"
else
  compdef _leasehold leasehold
fi
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// fishQuote returns s in single quotes for fish.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// fishFlag is the complete(1) options naming f, its value and description.
func fishFlag(f completionFlag) string {
	opt := "-l " + f.name
	if len(f.name) == 1 {
		opt = "-s " + f.name
	}
	switch {
	case f.files:
		opt += " -r -F"
	case len(f.values) > 0:
		opt += " -x -a " + fishQuote(strings.Join(f.values, " "))
	case f.arg != "":
		opt += " -x"
	}
	return opt + " -d " + fishQuote(f.usage)
}

// writeFishCompletion writes a fish script: commands with their summaries,
// each command's flags with their descriptions and values, files for submit.
func writeFishCompletion(w io.Writer, m completionModel) error {
	var b strings.Builder
	b.WriteString(`# fish completion for leasehold.
# Load it with:   leasehold completion fish | source
# or install it:  leasehold completion fish > ~/.config/fish/completions/leasehold.fish

`)
	fmt.Fprintf(&b, "set -l commands %s\n", m.commandNames())
	b.WriteString("complete -c leasehold -f\n")
	for _, c := range m.commands {
		fmt.Fprintf(&b, "complete -c leasehold -n \"not __fish_seen_subcommand_from $commands\" -a %s -d %s\n", c.name, fishQuote(c.summary))
	}
	for _, f := range m.globals {
		fmt.Fprintf(&b, "complete -c leasehold %s\n", fishFlag(f))
	}
	for _, c := range m.commands {
		cond := "-n " + fishQuote("__fish_seen_subcommand_from "+c.name)
		for _, f := range c.flags {
			fmt.Fprintf(&b, "complete -c leasehold %s %s\n", cond, fishFlag(f))
		}
		switch {
		case c.files:
			fmt.Fprintf(&b, "complete -c leasehold %s -F\n", cond)
		case len(c.args) > 0:
			fmt.Fprintf(&b, "complete -c leasehold %s -a %s\n", cond, fishQuote(strings.Join(c.args, " ")))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
