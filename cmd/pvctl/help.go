package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// The help is made from the flag sets the commands parse (command.flags):
// what it lists is what pvctl takes.

const helpIntro = `usage: pvctl [GLOBAL FLAGS] COMMAND [FLAGS] [ARGS]
       pvctl help [COMMAND]

pvctl brings up the pvrdma NIC on the machine that has it (as root), or runs
on the device model anywhere (--model). BDF defaults to the only pvrdma
function present.
`

const helpExit = `Exit status: 0 when the command did its work (list also when it finds no
function: --json then prints []); 1 when it failed, the reason on stderr; 2
for a usage error (an unknown command or flag, a bad flag value, flags that
exclude each other), told in one line on stderr before any device is opened.
`

// printHelp writes the whole help: the commands, the global flags, the
// exit status, then every command's usage and flags.
func printHelp(w io.Writer) {
	fmt.Fprint(w, helpIntro+"\n")
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Global flags (before the command):")
	gfs := flag.NewFlagSet("pvctl", flag.ContinueOnError)
	globalFlags(&env{}, gfs)
	printFlags(w, gfs)
	fmt.Fprintln(w)
	fmt.Fprint(w, helpExit)
	for _, c := range commands() {
		fmt.Fprintln(w)
		printCommandHelp(w, c)
	}
}

// printCommandHelp writes a command's usage, what it does and its flags.
func printCommandHelp(w io.Writer, c command) {
	fmt.Fprintf(w, "usage: pvctl %s %s\n\n", c.name, c.usage)
	fmt.Fprintln(w, wrap(upperFirst(c.summary)+".", "", 78))
	if c.about != "" {
		fmt.Fprintln(w)
		fmt.Fprintln(w, strings.TrimRight(c.about, "\n"))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Flags:")
	printFlags(w, c.flagSet())
	fmt.Fprintln(w, "  (and the global flags before the command: --json, --model SPEC, --fabric DIR, --sysfs DIR, --vfio PATH; see pvctl help)")
}

// aliasPrefix starts the usage of a one-letter alias of a long flag.
const aliasPrefix = "short for --"

// printFlags writes fs's flags, two dashes each, a one-letter alias beside
// its long flag ("-e, --events"), the value's placeholder after the name,
// the usage indented below with the default when it is not the zero value.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	short := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if long, ok := strings.CutPrefix(f.Usage, aliasPrefix); ok && fs.Lookup(long) != nil {
			short[long] = f.Name
		}
	})
	fs.VisitAll(func(f *flag.Flag) {
		if long, ok := strings.CutPrefix(f.Usage, aliasPrefix); ok && fs.Lookup(long) != nil {
			return
		}
		name, usage := flag.UnquoteUsage(f)
		head := "  --" + f.Name
		if s, ok := short[f.Name]; ok {
			head = "  -" + s + ", --" + f.Name
		}
		if ph := placeholder(name); ph != "" {
			head += " " + ph
		}
		if d := defaultText(f); d != "" {
			usage += " (default " + d + ")"
		}
		fmt.Fprintln(w, head)
		fmt.Fprintln(w, wrap(usage, "        ", 78))
	})
}

// placeholder names a flag's value in the help: the word the usage
// back-quotes, or one for its type ("" for a bool).
func placeholder(name string) string {
	switch name {
	case "":
		return ""
	case "int", "uint", "int64", "uint64":
		return "N"
	case "duration":
		return "DURATION"
	case "string":
		return "STRING"
	case "float", "float64":
		return "X"
	case "value":
		return "VALUE"
	}
	return name
}

// defaultText is a flag's default as help shows it, "" for the zero value.
func defaultText(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "false", "0s":
		return ""
	}
	return f.DefValue
}

// wrap fills s into lines of at most width columns, each starting with
// indent.
func wrap(s, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, word := range strings.Fields(s) {
		if len(line) > len(indent) && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	b.WriteString(line)
	return b.String()
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
