package event

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkPollSet: the cost of one Poll over fake sources, all idle after
// the warm-up, or all idle but one that always holds an event.
func BenchmarkPollSet(b *testing.B) {
	for _, members := range []int{1, 64, 1024} {
		for _, mode := range []string{"idle", "oneActive"} {
			b.Run(fmt.Sprintf("members=%d/%s", members, mode), func(b *testing.B) {
				fs := newFakeSources(&fakeSyncer{}, members)
				ps := NewPollSet[int]()
				for i, f := range fs {
					require.NoError(b, ps.Add(f, i))
				}
				out := make([]int, 16)
				for range DefaultIdleAfter + 1 {
					_, _ = ps.Poll(out)
				}
				require.EqualValues(b, members, ps.Stats().Idled, "members idle after the warm-up")
				want := 0
				if mode == "oneActive" {
					fs[members/2].produce(1) // never drained: woken, then hot for good
					want = 1
				}
				n, err := ps.Poll(out)
				require.NoError(b, err)
				require.Equal(b, want, n, "Poll's count")
				b.ReportAllocs()
				for b.Loop() {
					_, _ = ps.Poll(out)
				}
			})
		}
	}
}

// BenchmarkPollSetAllHot: every member hot (they never idle) and empty, so
// Poll checks each; ns/member is the cost of one hot member.
func BenchmarkPollSetAllHot(b *testing.B) {
	for _, members := range []int{64, 1024} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) {
			fs := newFakeSources(&fakeSyncer{}, members)
			ps := NewPollSet[int]()
			ps.SetIdleAfter(1 << 30)
			for i, f := range fs {
				require.NoError(b, ps.Add(f, i))
			}
			out := make([]int, 16)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = ps.Poll(out)
			}
			if st := ps.Stats(); st.Idled != 0 {
				b.Fatalf("%d members went idle", st.Idled)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(members), "ns/member")
		})
	}
}

func BenchmarkCounterRead(b *testing.B) {
	c := NewCounter()
	c.Count(1)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = c.Read()
	}
}

func BenchmarkCounterCount(b *testing.B) {
	b.Run("alone", func(b *testing.B) {
		c := NewCounter()
		b.ReportAllocs()
		for b.Loop() {
			c.Count(1)
		}
	})
	// In a poll set: Count wakes one watcher.
	b.Run("watched", func(b *testing.B) {
		c := NewCounter()
		ps := NewPollSet[int]()
		require.NoError(b, ps.Add(c, 0))
		b.ReportAllocs()
		for b.Loop() {
			c.Count(1)
		}
	})
}

// BenchmarkWaitSetTryWaitIdle: TryWait over 8 quiet members. On an FD set
// each call clears the eventfd with a read(2) (EAGAIN when already clear):
// one syscall per TryWait; a Chan set has none.
func BenchmarkWaitSetTryWaitIdle(b *testing.B) {
	for _, kind := range []Kind{FD, Chan} {
		b.Run(kind.String(), func(b *testing.B) {
			fs := newFakeSources(&fakeSyncer{}, 8)
			ws, err := NewWaitSet(kind)
			if err != nil {
				b.Fatal(err)
			}
			for _, f := range fs {
				if err := ws.Add(f); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := ws.TryWait(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			for _, f := range fs {
				_ = ws.Remove(f)
			}
			_ = ws.Close()
		})
	}
}

// BenchmarkWaitSetWakeTryWait: a Wake that raises the wait object, then the
// TryWait that clears it (on an FD set, one write(2) and one read(2)).
func BenchmarkWaitSetWakeTryWait(b *testing.B) {
	for _, kind := range []Kind{FD, Chan} {
		b.Run(kind.String(), func(b *testing.B) {
			ws, err := NewWaitSet(kind)
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				ws.Wake()
				if err := ws.TryWait(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			require.NoError(b, ws.Close())
		})
	}
}
