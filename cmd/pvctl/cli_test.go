package main

import (
	"bytes"
	"flag"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pci/pcitest"
)

// runPvctl runs pvctl with args on a sysfs tree with no PCI function (a
// host without the NIC), and returns its exit status, stdout, stderr and
// env.
func runPvctl(t *testing.T, args ...string) (code int, stdout, stderr string, e *env) {
	t.Helper()
	var out, errb bytes.Buffer
	e = &env{out: &out, errOut: &errb, runDir: t.TempDir()}
	code = run(e, append([]string{"--sysfs", pcitest.New(t).Root}, args...))
	return code, out.String(), errb.String(), e
}

// allFlags returns a flag set's flags as help shows them: --name, or
// "-x, --name" for a long flag with a one-letter alias.
func allFlags(fs *flag.FlagSet) []string {
	short := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if long, ok := strings.CutPrefix(f.Usage, aliasPrefix); ok {
			short[long] = f.Name
		}
	})
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		switch s, ok := short[f.Name]; {
		case strings.HasPrefix(f.Usage, aliasPrefix):
		case ok:
			names = append(names, "-"+s+", --"+f.Name)
		default:
			names = append(names, "--"+f.Name)
		}
	})
	return names
}

// globalFlagSet is the flags before the command.
func globalFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("pvctl", flag.ContinueOnError)
	globalFlags(&env{}, fs)
	return fs
}

// singleDash finds a long flag written with one dash (Go's style), which
// pvctl's help and docs never use.
var singleDash = regexp.MustCompile(`(^|[\s\[(|])-[a-z][a-z0-9]+(-[a-z0-9]+)*\b`)

// pvctl -h, --help and help write everything to stdout and exit 0: every
// command, its usage line and every flag of it (from its flag set), two
// dashes each, and the global flags.
func TestHelpListsEveryCommandAndFlag(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, errOut, _ := runPvctl(t, args...)
			require.Equal(t, 0, code)
			assert.Empty(t, errOut)
			for _, f := range allFlags(globalFlagSet()) {
				assert.Contains(t, out, "  "+f, "global flag")
			}
			assert.Contains(t, out, "--sysfs DIR")
			assert.Contains(t, out, "--model SPEC")
			assert.Contains(t, out, "Exit status:")
			for _, c := range commands() {
				assert.Contains(t, out, "usage: pvctl "+c.name+" "+c.usage+"\n", c.name)
				for _, f := range allFlags(c.flagSet()) {
					assert.Contains(t, out, "  "+f, "%s's flag", c.name)
				}
			}
			assert.NotContains(t, out, "Usage of")
			for _, l := range strings.Split(out, "\n") {
				assert.NotRegexp(t, singleDash, l, "a long flag with one dash")
			}
		})
	}
}

// pvctl help CMD, pvctl CMD -h and pvctl CMD --help write the command's
// usage ("usage: pvctl pingpong [FLAGS] [BDF]") and flags to stdout and
// exit 0.
func TestCommandHelp(t *testing.T) {
	for _, c := range commands() {
		for _, args := range [][]string{{"help", c.name}, {c.name, "-h"}, {c.name, "--help"}} {
			code, out, errOut, e := runPvctl(t, args...)
			require.Equal(t, 0, code, "%v", args)
			assert.Empty(t, errOut, "%v", args)
			assert.True(t, strings.HasPrefix(out, "usage: pvctl "+c.name+" "+c.usage+"\n"), "%v: %q", args, out)
			for _, f := range allFlags(c.flagSet()) {
				assert.Contains(t, out, "  "+f, "%v", args)
			}
			assert.Zero(t, e.reached, "%v: help reaches for no device", args)
		}
	}
	_, out, _, _ := runPvctl(t, "help", "pingpong")
	for _, s := range []string{"usage: pvctl pingpong [FLAGS] [BDF]", "  --size N\n", "  -e, --events\n", "  --wait-peer DURATION\n",
		"(default 5m0s)", "  --connect HOST:PORT\n", "  --listen ADDR\n"} {
		assert.Contains(t, out, s)
	}
	assert.NotContains(t, out, "\n  --e\n", "the alias is beside its long flag")
}

// An unknown command or flag, or a bad flag value, is one line on stderr
// with a hint to the help, and exit status 2.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "pvctl: no command (see 'pvctl help')"},
		{[]string{"nope"}, `pvctl: unknown command "nope" (see 'pvctl help')`},
		{[]string{"--nope"}, "pvctl: unknown flag --nope (see 'pvctl help')"},
		{[]string{"help", "nope"}, `help: unknown command "nope"`},
		{[]string{"--model", "v99", "info"}, `pvctl: --model "v99": the version is v17 to v20`},
		{[]string{"pingpong", "--nope"}, "pvctl pingpong: unknown flag --nope (see 'pvctl help pingpong')"},
		{[]string{"bench", "--size", "x"}, `pvctl bench: invalid value "x" for --size: parse error (see 'pvctl help bench')`},
		{[]string{"bench", "--size"}, "pvctl bench: a value is missing after --size"},
		{[]string{"eth", "bogus"}, `pvctl eth: unknown eth subcommand "bogus": want info, ping, serve, gen or sink`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut, _ := runPvctl(t, tc.args...)
			assert.Equal(t, 2, code)
			assert.Empty(t, out)
			assert.Contains(t, errOut, tc.want)
			assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			assert.Contains(t, errOut, "pvctl help")
		})
	}
}

// Every flag is checked before a device is reached: on a host without the
// NIC a bad flag is reported as itself (exit status 2), never as "no
// pvrdma function", and nothing is looked up or opened; on --model the
// model is never made.
func TestFlagErrorsComeBeforeTheDevice(t *testing.T) {
	for cmd, cases := range map[string][]struct {
		args []string
		want string
	}{
		"pingpong": {
			{[]string{"--size", "-5"}, "--size -5: want 0 to 1073741824 bytes"},
			{[]string{"--size", "2147483648"}, "--size 2147483648: want 0 to"},
			{[]string{"--rc", "--ud"}, "--rc and --ud exclude each other"},
			{[]string{"--listen", ":7000", "--connect", "h:7000"}, "--listen, --connect and --vm exclude each other"},
			{[]string{"--listen", ":7000", "--vm"}, "exclude each other"},
			{[]string{"--connect", "10.0.0.300:7000"}, `"10.0.0.300" is not an IP address`},
			{[]string{"--connect", "server"}, `--connect "server": want HOST:PORT`},
			{[]string{"--connect", "server:0"}, `port "0": want a number from 1 to 65535`},
			{[]string{"--connect", "server:99999"}, `port "99999"`},
			{[]string{"--connect", "server:http"}, `port "http"`},
			{[]string{"--connect", ":7000"}, "want the server's host before the port"},
			{[]string{"--listen", "bad_host!:7000"}, "is neither an IP address nor a host name"},
			{[]string{"--rdma-core", "--connect", "1.2.3"}, `"1.2.3" is not an IP address`},
			{[]string{"--rdma-core"}, "--rdma-core needs --listen ADDR or --connect HOST"},
			{[]string{"--iters", "0"}, "--iters 0: want 1 or more round trips"},
			{[]string{"--iters", "-3"}, "--iters -3: want 1 or more"},
			{[]string{"--iters", "20000000"}, "at most 10000000"},
			{[]string{"--stall", "0s"}, "--stall 0s: want a positive duration"},
			{[]string{"--wait-peer", "0s"}, "--wait-peer 0s: want a positive duration"},
			{[]string{"--srq", "0"}, "--srq 0: want a number of connections"},
			{[]string{"--srq", "5000"}, "at most 1024"},
			{[]string{"--write", "--read"}, "--write, --read and --atomic exclude each other"},
			{[]string{"--events", "--poll-doorbell"}, "--poll-doorbell and --events exclude each other"},
			{[]string{"--spin", "--events"}, "--spin and --events exclude each other"},
			{[]string{"--vm", "--tag", ""}, "--vm needs a rendezvous key prefix"},
			{[]string{"0000:00:10.1", "0000:00:10.2"}, "one BDF at most"},
			{[]string{"zz"}, "zz"},
			{[]string{"--model", "v20", "--listen", ":7000"}, "--model runs both ends in this process"},
			{[]string{"--model", "v20", "0000:00:10.1"}, "--model runs on the model: no BDF"},
		},
		"bench": {
			{[]string{"--messages", "0"}, "--messages 0: want 1 or more messages per batch size"},
			{[]string{"--model", "v20", "--messages", "0"}, "--messages 0: want 1 or more"},
			{[]string{"--messages", "-1"}, "--messages -1"},
			{[]string{"--batches", "0"}, `--batches "0": "0": want sizes from 1 to 256`},
			{[]string{"--batches", "1,x"}, `"x": want sizes from 1 to 256`},
			{[]string{"--batches", "512"}, "want sizes from 1 to 256"},
			{[]string{"--batches", ""}, "want sizes from 1 to 256"},
			{[]string{"--window", "-1"}, "--window -1: want 1 to 512 messages"},
			{[]string{"--spin", "--wait"}, "--spin and --wait exclude each other"},
			{[]string{"--atomic", "--size", "64"}, "--atomic --size 64: the atomic works on one 8-byte word"},
			{[]string{"--atomic", "--spin"}, "--atomic: the target posts nothing"},
			{[]string{"--size", "-1"}, "--size -1: want 0 to"},
			{[]string{"--ud", "--rc"}, "--rc and --ud exclude each other"},
			{[]string{"--listen", "1.2.3.4:70000"}, `port "70000"`},
			{[]string{"--connect", "h:1", "--listen", ":1"}, "exclude each other"},
			{[]string{"--send-spin", "--events"}, "--send-spin and --events exclude each other"},
		},
		"am": {
			{[]string{"--iters", "0"}, "--iters 0: want 1 or more round trips per size"},
			{[]string{"--messages", "0"}, "--messages 0: want 1 or more messages per size"},
			{[]string{"--bw-messages", "-1"}, "--bw-messages -1: want 1 or more"},
			{[]string{"--bw-size", "0"}, "--bw-size 0: want 1 to 67108864 bytes"},
			{[]string{"--bw-size", "134217728"}, "--bw-size 134217728"},
			{[]string{"--sizes", "8,y"}, `--sizes "8,y": "y": want sizes from 0 to 67108864 bytes`},
			{[]string{"--sizes", "134217728"}, "want sizes from 0 to 67108864"},
			{[]string{"--listen", ":1", "--vm"}, "exclude each other"},
			{[]string{"--connect", "nohost"}, `--connect "nohost": want HOST:PORT`},
			{[]string{"--wait-peer", "-1s"}, "--wait-peer -1s"},
			{[]string{"--model", "qemu", "--connect", "h:1"}, "--model runs both ends in this process"},
		},
		"eth": {
			{[]string{"ping"}, "eth ping needs the IPv4 address to ping"},
			{[]string{"ping", "1.2.3"}, `eth ping "1.2.3": want an IPv4 address`},
			{[]string{"ping", "::1"}, `eth ping "::1": want an IPv4 address`},
			{[]string{"ping", "--count", "0", "1.2.3.4"}, "--count 0: want 1 or more echo requests"},
			{[]string{"ping", "--size", "-1", "1.2.3.4"}, "--size -1: want 0 to 65507 payload bytes"},
			{[]string{"--ip", "x"}, `--ip "x": want an IPv4 address`},
			{[]string{"serve", "--ip", "fe80::1"}, `--ip "fe80::1": want an IPv4 address`},
			{[]string{"gen", "--to", "zz"}, `--to "zz": want an Ethernet MAC address`},
			{[]string{"gen", "--sizes", "10"}, `--sizes "10": 10: a frame holds its 14-byte header at least`},
			{[]string{"gen", "--sizes", "64,x"}, `--sizes "64,x": want a comma-separated list of positive numbers`},
			{[]string{"gen", "--batches", "0"}, `--batches "0": want a comma-separated list`},
			{[]string{"gen", "--frames", "0"}, "--frames 0: want 1 or more frames"},
			{[]string{"sink", "--for", "0s"}, "--for 0s: want a positive duration"},
			{[]string{"sink", "--idle", "-1s"}, "--idle -1s: want a positive duration"},
			{[]string{"info", "--vm"}, "--vm: only eth gen runs between two VMs"},
			{[]string{"ping", "--json", "1.2.3.4"}, "eth ping prints text only: no --json"},
			{[]string{"info", "0000:00:10.1", "x"}, "one BDF at most"},
		},
		"list":   {{[]string{"extra"}, `list takes no argument, not "extra"`}, {[]string{"--nope"}, "unknown flag --nope"}},
		"bind":   {{[]string{"a", "b"}, "one BDF at most"}, {[]string{"zz"}, "zz"}, {[]string{"--force=maybe"}, "--force"}},
		"unbind": {{[]string{"--x"}, "unknown flag --x"}, {[]string{"00:10.1", "00:10.0"}, "one BDF at most"}},
		"info":   {{[]string{"zz"}, "zz"}, {[]string{"--model", "v20", "00:10.1"}, "--model runs on the model: no BDF"}},
		"regs":   {{[]string{"1", "2"}, "one BDF at most"}, {[]string{"--model", "qemu", "00:10.1"}, "no BDF"}},
	} {
		for _, tc := range cases {
			// --model, if given, goes before the command.
			args := append([]string{cmd}, tc.args...)
			if len(tc.args) >= 2 && tc.args[0] == "--model" {
				args = append([]string{"--model", tc.args[1], cmd}, tc.args[2:]...)
			}
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut, e := runPvctl(t, args...)
				assert.Equal(t, 2, code, "exit status")
				assert.Contains(t, errOut, tc.want)
				assert.True(t, strings.HasPrefix(errOut, "pvctl "+cmd+": "), "%q", errOut)
				assert.Contains(t, errOut, "(see 'pvctl help "+cmd+"')")
				assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
				assert.NotContains(t, errOut, "no pvrdma function")
				assert.Empty(t, out)
				assert.Zero(t, e.reached, "a device was reached for")
			})
		}
	}
}

// The flags above, well formed, pass the checks: the command reaches for
// the device, and on a host without the NIC says so (exit status 1).
func TestGoodFlagsReachTheDevice(t *testing.T) {
	for _, args := range [][]string{
		{"pingpong", "--size", "0", "--iters", "1"},
		{"pingpong", "--rdma-core", "--listen", "0.0.0.0"},
		{"pingpong", "--rdma-core", "--connect", "192.168.100.2"},
		{"pingpong", "--listen", ":7000", "--wait-peer", "1s"},
		{"pingpong", "--connect", "[::1]:7000"},
		{"pingpong", "--connect", "host-1.example:7000"},
		{"bench", "--messages", "1", "--batches", "1,256", "--window", "512"},
		{"bench", "--atomic", "--size", "8"},
		{"am", "--sizes", "0,67108864", "--bw-size", "67108864"},
		{"eth", "ping", "--size", "0", "10.0.2.2"},
		{"eth", "gen", "--sizes", "14", "--vm"},
		{"info", "0000:00:10.1"},
		{"bind", "--dry-run"},
	} {
		code, _, errOut, e := runPvctl(t, args...)
		assert.Equal(t, 1, code, "%v: %s", args, errOut)
		assert.Equal(t, 1, e.reached, "%v", args)
		if len(args) == 1 || args[len(args)-1] != "0000:00:10.1" {
			assert.Contains(t, errOut, "no pvrdma function", "%v", args)
		}
	}
}

// docFlags checks the pvctl lines of a document (the README's pvctl
// section, the package doc): every --flag a line names is a flag of a
// command the line names (the global flags and, on a line naming none,
// any command's, allowed); an indented line goes on the line before it;
// no pvctl line writes a long flag with one dash; and every command has
// a pvctl line.
func docFlags(t *testing.T, where, text string) {
	t.Helper()
	cmds := map[string]map[string]bool{}
	anyCmd := map[string]bool{}
	for _, c := range commands() {
		cmds[c.name] = map[string]bool{}
		c.flagSet().VisitAll(func(f *flag.Flag) { cmds[c.name][f.Name] = true; anyCmd[f.Name] = true })
	}
	global := map[string]bool{}
	globalFlagSet().VisitAll(func(f *flag.Flag) { global[f.Name] = true })
	global["help"] = true // -h, --help: the flag package's
	flagRE := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	wordRE := regexp.MustCompile(`[a-z]+`)
	documented := map[string]bool{}
	var named []string // the commands of the last pvctl line
	for _, line := range strings.Split(text, "\n") {
		trim := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trim, "pvctl "):
			named = nil
			for _, w := range wordRE.FindAllString(strings.SplitN(trim, "#", 2)[0], -1) {
				if _, ok := cmds[w]; ok {
					named = append(named, w)
					documented[w] = true
				}
			}
			assert.NotRegexp(t, singleDash, trim, "%s: a long flag with one dash", where)
		case trim != "" && (strings.HasPrefix(line, "\t ") || strings.HasPrefix(line, "     ")) && named != nil:
			// A continuation of the pvctl line above.
		default:
			named = nil
		}
		for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
			f := m[1]
			ok := global[f]
			if len(named) == 0 {
				ok = ok || anyCmd[f]
			}
			for _, c := range named {
				ok = ok || cmds[c][f]
			}
			assert.True(t, ok, "%s names --%s, which %v does not take: %q", where, f, named, trim)
		}
	}
	for _, c := range commands() {
		assert.True(t, documented[c.name], "%s has no pvctl line for %s", where, c.name)
	}
}

// isVerbsProgram reports a host verbs program's name (rdma-core's ibv_*,
// perftest's ib_*, ucx_perftest): pvvm runs those in a vfrdma VM over the
// drop-in, not as pvctl commands.
func isVerbsProgram(name string) bool {
	return strings.HasPrefix(name, "ibv_") || strings.HasPrefix(name, "ib_") || strings.HasPrefix(name, "ucx_")
}

// The README's pvctl section and the package doc name only flags pvctl
// takes, two dashes each, and document every command; the pvctl command
// lines the README runs in VMs name real flags too.
func TestDocsNameRealFlags(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	readme := string(b)
	start := strings.Index(readme, "`pvctl` is the bring-up tool")
	end := strings.Index(readme, "## Running things in a VM")
	require.True(t, start > 0 && end > start, "the README's pvctl section")
	docFlags(t, "README", readme[start:end])

	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	require.NotNil(t, f.Doc)
	docFlags(t, "the package doc", f.Doc.Text())

	vmEnd := strings.Index(readme[end:], "\n## ")
	require.Positive(t, vmEnd)
	for _, line := range strings.Split(readme[end:end+vmEnd], "\n") {
		_, cmdline, ok := strings.Cut(line, "go run ./cmd/pvvm")
		if !ok || strings.Contains(cmdline, "-ref") || strings.Contains(cmdline, "-test") {
			continue
		}
		_, args, ok := strings.Cut(strings.SplitN(cmdline, "#", 2)[0], " -- ")
		if !ok {
			continue
		}
		for _, part := range strings.Split(args, " + ") {
			words := strings.Fields(part)
			if len(words) > 0 && strings.HasPrefix(words[0], "@") {
				words = words[1:]
			}
			if len(words) == 0 || isVerbsProgram(words[0]) {
				continue // none, or a host program pvvm runs over the drop-in
			}
			c, ok := lookup(words[0])
			if !assert.True(t, ok, "README runs pvctl %q in a VM: no such command", words[0]) {
				continue
			}
			fs, gfs := c.flagSet(), globalFlagSet()
			for _, w := range words[1:] {
				if name, ok := strings.CutPrefix(w, "--"); ok {
					assert.True(t, fs.Lookup(name) != nil || gfs.Lookup(name) != nil, "README runs pvctl %s %s: no such flag", c.name, w)
				}
			}
		}
	}
}

// eth ping's payload must fit the link's frames with its headers (14 +
// 20 + 8 bytes): checked once the NIC says its frame size.
func TestEchoFitsTheFrame(t *testing.T) {
	require.NoError(t, echoFits(1472, 1514))
	assert.ErrorContains(t, echoFits(1473, 1514), "--size 1473: an echo request of 1515 bytes does not fit the link's 1514-byte frames")
}

// --listen and --connect take HOST:PORT, the host an IP address or a
// well-formed host name (a server may leave it out; with --rdma-core the
// port too).
func TestCheckAddr(t *testing.T) {
	for _, tc := range []struct {
		addr             string
		listen, rdmaCore bool
		bad              string
	}{
		{addr: "10.0.0.1:7000"},
		{addr: "[fe80::1%eth0]:7000"},
		{addr: "host-1.example.com.:7000"},
		{addr: "under_score:7000"},
		{addr: strings.Repeat("a", 63) + ".example:7000"},
		{addr: ":7000", listen: true},
		{addr: "0.0.0.0", listen: true, rdmaCore: true},
		{addr: "::1", rdmaCore: true},
		{addr: "peer", rdmaCore: true},
		{addr: ":7000", bad: "want the server's host"},
		{addr: "peer", bad: "want HOST:PORT"},
		{addr: "peer:", bad: `port ""`},
		{addr: "peer:65536", bad: `port "65536"`},
		{addr: "1.2.3.4.5:1", bad: "is not an IP address"},
		{addr: "[fe80::zz]:1", bad: "is not an IP address"},
		{addr: "-peer:1", bad: "neither an IP address nor a host name"},
		{addr: "peer-.example:1", bad: "neither"},
		{addr: "a..b:1", bad: "neither"},
		{addr: strings.Repeat("a", 64) + ".example:1", bad: "neither"},
		{addr: strings.Repeat("abcdefghi.", 26) + "com:1", bad: "neither"},
		{addr: "pe%r:1", bad: "neither"},
	} {
		err := checkAddr("--connect", tc.addr, tc.listen, tc.rdmaCore)
		if tc.bad == "" {
			assert.NoError(t, err, tc.addr)
			continue
		}
		require.Error(t, err, tc.addr)
		assert.ErrorIs(t, err, errUsage, tc.addr)
		assert.Contains(t, err.Error(), tc.bad, tc.addr)
	}
}

// A flag's help: two dashes, its one-letter alias first, its value's
// placeholder, the usage wrapped under it at 78 columns, the default when
// it is not the zero value.
func TestPrintFlagsFormat(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Bool("events", false, "sleep on the interrupt")
	fs.Bool("e", false, "short for --events")
	fs.Bool("q", false, "short for --quiet") // no --quiet: a flag of its own
	fs.Bool("spin", true, "poll")
	fs.Int("iters", 1000, "round trips")
	fs.Int("srq", 0, "`N` connections")
	fs.String("connect", "", "connect to `HOST:PORT`")
	fs.Duration("wait-peer", 0, strings.Repeat("word ", 20)+"end")
	var b bytes.Buffer
	printFlags(&b, fs)
	assert.Equal(t, `  --connect HOST:PORT
        connect to HOST:PORT
  -e, --events
        sleep on the interrupt
  --iters N
        round trips (default 1000)
  --q
        short for --quiet
  --spin
        poll (default true)
  --srq N
        N connections
  --wait-peer DURATION
        word word word word word word word word word word word word word word
        word word word word word word end
`, b.String())
}

func TestWrap(t *testing.T) {
	assert.Equal(t, "  a bb\n  ccc", wrap("a  bb ccc", "  ", 7))
	assert.Equal(t, "  a bbb", wrap("a bbb", "  ", 7), "a line of exactly the width")
	assert.Equal(t, "  averylongword\n  b", wrap("averylongword b", "  ", 7), "a word longer than the width has a line of its own")
	assert.Equal(t, "  a\n  bbbb", wrap("a bbbb", "  ", 7), "one column over")
	assert.Equal(t, "", wrap("", "", 7))
}

// A command's help: its usage line, its summary as a sentence, what more
// it says, its flags, and a pointer to the global flags.
func TestPrintCommandHelpFormat(t *testing.T) {
	c := command{name: "x", usage: "[FLAGS] [BDF]", summary: "do a thing", about: "More.\n",
		flags: func(e *env, fs *flag.FlagSet) { fs.Int("n", 2, "how many") }}
	var b bytes.Buffer
	printCommandHelp(&b, c)
	assert.Equal(t, `usage: pvctl x [FLAGS] [BDF]

Do a thing.

More.

Flags:
  --json
        print one JSON document instead of text
  --n N
        how many (default 2)
  (and the global flags before the command: --json, --model SPEC, --fabric DIR, --sysfs DIR, --vfio PATH; see pvctl help)
`, b.String())
	c.about = ""
	b.Reset()
	printCommandHelp(&b, c)
	assert.True(t, strings.HasPrefix(b.String(), "usage: pvctl x [FLAGS] [BDF]\n\nDo a thing.\n\nFlags:\n"), b.String())
}

// The whole help starts with the usage, then the commands, the global
// flags and the exit status, each part after a blank line.
func TestPrintHelpLayout(t *testing.T) {
	var b bytes.Buffer
	printHelp(&b)
	assert.True(t, strings.HasPrefix(b.String(), helpIntro+"\nCommands:\n  list      pvrdma and vmxnet3"), b.String())
	assert.Contains(t, b.String(), "function present.\n\nCommands:\n")
	assert.Contains(t, b.String(), "sink\n\nGlobal flags (before the command):\n  --fabric DIR\n")
	assert.Contains(t, b.String(), "(default auto)\n\nExit status:")
	assert.Contains(t, b.String(), "any device is opened.\n\nusage: pvctl list [--json]\n")
}
