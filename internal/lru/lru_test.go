package lru

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// order returns the keys from most to least recently used, checking the list's links.
func (c *Cache[K, V]) order(t *testing.T) []K {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var keys []K
	var total int64
	prev := &c.root
	for e := c.root.next; e != &c.root; e = e.next {
		if e.prev != prev {
			t.Fatalf("broken back link at %v", e.key)
		}
		if c.items[e.key] != e {
			t.Fatalf("list entry %v not in map", e.key)
		}
		keys = append(keys, e.key)
		total += e.size
		prev = e
		if len(keys) > len(c.items)+1 {
			t.Fatalf("list longer than map (cycle?)")
		}
	}
	if c.root.prev != prev {
		t.Fatalf("root.prev does not name the last entry")
	}
	if len(keys) != len(c.items) {
		t.Fatalf("list has %d entries, map %d", len(keys), len(c.items))
	}
	if total != c.bytes {
		t.Fatalf("bytes = %d, sum of sizes = %d", c.bytes, total)
	}
	return keys
}

func checkBounds[K comparable, V any](t *testing.T, c *Cache[K, V], maxEntries int, maxBytes int64) {
	t.Helper()
	if n := c.Len(); n > maxEntries && !(maxEntries <= 0 && n == 0) {
		t.Fatalf("Len = %d > maxEntries %d", n, maxEntries)
	}
	if maxEntries <= 0 && c.Len() != 0 {
		t.Fatalf("disabled cache holds %d entries", c.Len())
	}
	if maxBytes > 0 && c.Bytes() > maxBytes {
		t.Fatalf("Bytes = %d > maxBytes %d", c.Bytes(), maxBytes)
	}
	if c.Bytes() < 0 {
		t.Fatalf("Bytes = %d < 0", c.Bytes())
	}
}

func TestGetMissAndHit(t *testing.T) {
	c := New[string, int](4, 100)
	if v, ok := c.Get("a"); ok || v != 0 {
		t.Fatalf("Get on empty = %v, %v", v, ok)
	}
	c.Add("a", 1, 10)
	if v, ok := c.Get("a"); !ok || v != 1 {
		t.Fatalf("Get(a) = %v, %v", v, ok)
	}
	if c.Len() != 1 || c.Bytes() != 10 {
		t.Fatalf("Len, Bytes = %d, %d", c.Len(), c.Bytes())
	}
}

func TestLRUOrder(t *testing.T) {
	c := New[string, int](3, 0)
	c.Add("a", 1, 1)
	c.Add("b", 2, 1)
	c.Add("c", 3, 1)
	if got := c.order(t); !slices.Equal(got, []string{"c", "b", "a"}) {
		t.Fatalf("order = %v", got)
	}
	c.Get("a") // a becomes most recent; b is now the oldest
	if got := c.order(t); !slices.Equal(got, []string{"a", "c", "b"}) {
		t.Fatalf("order after Get(a) = %v", got)
	}
	c.Add("d", 4, 1) // evicts b
	if _, ok := c.Get("b"); ok {
		t.Fatal("b survived eviction")
	}
	if got := c.order(t); !slices.Equal(got, []string{"d", "a", "c"}) {
		t.Fatalf("order after Add(d) = %v", got)
	}
	c.Add("c", 33, 1) // replacement moves c to the front
	if got := c.order(t); !slices.Equal(got, []string{"c", "d", "a"}) {
		t.Fatalf("order after replacing c = %v", got)
	}
	c.Add("e", 5, 1) // evicts a
	if got := c.order(t); !slices.Equal(got, []string{"e", "c", "d"}) {
		t.Fatalf("order after Add(e) = %v", got)
	}
	if v, _ := c.Get("c"); v != 33 {
		t.Fatalf("c = %d, want the replacement 33", v)
	}
}

func TestByteBoundEvictsOldest(t *testing.T) {
	c := New[int, string](100, 10)
	c.Add(1, "a", 4)
	c.Add(2, "b", 4)
	c.Add(3, "c", 4) // 12 > 10: evicts 1
	if got := c.order(t); !slices.Equal(got, []int{3, 2}) || c.Bytes() != 8 {
		t.Fatalf("order = %v, bytes = %d", got, c.Bytes())
	}
	c.Add(4, "d", 10) // exactly the bound: evicts everything else
	if got := c.order(t); !slices.Equal(got, []int{4}) || c.Bytes() != 10 {
		t.Fatalf("order = %v, bytes = %d", got, c.Bytes())
	}
}

func TestOversizedEntryNotCached(t *testing.T) {
	c := New[string, string](10, 10)
	c.Add("small", "s", 3)
	c.Add("big", "b", 11)
	if _, ok := c.Get("big"); ok {
		t.Fatal("entry larger than maxBytes was cached")
	}
	if _, ok := c.Get("small"); !ok {
		t.Fatal("oversized Add evicted an unrelated entry")
	}
	if c.Len() != 1 || c.Bytes() != 3 {
		t.Fatalf("Len, Bytes = %d, %d", c.Len(), c.Bytes())
	}
	// Replacing a cached entry with an oversized value drops the old value: a stale
	// value must never be served.
	c.Add("small", "huge", 11)
	if v, ok := c.Get("small"); ok {
		t.Fatalf("stale value %q served after oversized replacement", v)
	}
	if c.Len() != 0 || c.Bytes() != 0 {
		t.Fatalf("Len, Bytes = %d, %d", c.Len(), c.Bytes())
	}
}

func TestReplacementAccounting(t *testing.T) {
	c := New[string, int](10, 100)
	c.Add("a", 1, 30)
	c.Add("b", 2, 20)
	c.Add("a", 11, 50) // 50 + 20
	if c.Len() != 2 || c.Bytes() != 70 {
		t.Fatalf("Len, Bytes = %d, %d, want 2, 70", c.Len(), c.Bytes())
	}
	c.Add("a", 111, 5) // shrink: 5 + 20
	if c.Len() != 2 || c.Bytes() != 25 {
		t.Fatalf("Len, Bytes = %d, %d, want 2, 25", c.Len(), c.Bytes())
	}
	if v, _ := c.Get("a"); v != 111 {
		t.Fatalf("a = %d", v)
	}
	// Growing a replaced entry past the bound evicts others, never the new entry.
	c.Add("a", 1111, 90) // 90 + 20 > 100: b goes
	if got := c.order(t); !slices.Equal(got, []string{"a"}) || c.Bytes() != 90 {
		t.Fatalf("order = %v, bytes = %d", got, c.Bytes())
	}
	c.Remove("a")
	c.Remove("a") // removing twice is harmless
	if c.Len() != 0 || c.Bytes() != 0 {
		t.Fatalf("after Remove: Len, Bytes = %d, %d", c.Len(), c.Bytes())
	}
}

func TestNegativeSizeCountsAsZero(t *testing.T) {
	c := New[int, int](10, 10)
	c.Add(1, 1, -50)
	if c.Bytes() != 0 || c.Len() != 1 {
		t.Fatalf("Len, Bytes = %d, %d", c.Len(), c.Bytes())
	}
	c.Add(2, 2, 10)
	if c.Len() != 2 || c.Bytes() != 10 {
		t.Fatalf("Len, Bytes = %d, %d", c.Len(), c.Bytes())
	}
}

func TestDisabled(t *testing.T) {
	for _, max := range []int{0, -1} {
		c := New[string, int](max, 1000)
		c.Add("a", 1, 1)
		if _, ok := c.Get("a"); ok || c.Len() != 0 || c.Bytes() != 0 {
			t.Fatalf("maxEntries %d: cache stored an entry", max)
		}
		c.Remove("a")
		c.Purge()
	}
}

func TestNoByteBound(t *testing.T) {
	c := New[int, int](3, 0)
	c.Add(1, 1, 1<<40)
	c.Add(2, 2, 1<<40)
	if c.Len() != 2 || c.Bytes() != 2<<40 {
		t.Fatalf("Len, Bytes = %d, %d", c.Len(), c.Bytes())
	}
}

func TestPurge(t *testing.T) {
	c := New[int, int](10, 100)
	for i := range 10 {
		c.Add(i, i, 5)
	}
	c.Purge()
	if c.Len() != 0 || c.Bytes() != 0 || len(c.order(t)) != 0 {
		t.Fatalf("after Purge: Len, Bytes = %d, %d", c.Len(), c.Bytes())
	}
	if _, ok := c.Get(3); ok {
		t.Fatal("Get hit after Purge")
	}
	c.Add(1, 1, 5)
	if got := c.order(t); !slices.Equal(got, []int{1}) {
		t.Fatalf("order after Purge+Add = %v", got)
	}
}

func TestValuesStoredAsGiven(t *testing.T) {
	c := New[string, []byte](10, 100)
	b := []byte("abc")
	c.Add("k", b, int64(len(b)))
	got, _ := c.Get("k")
	if &got[0] != &b[0] {
		t.Fatal("cache copied the value; the documented contract is that it stores it as given")
	}
}

// model is the obvious reference: a slice from most to least recently used.
type model struct {
	maxEntries int
	maxBytes   int64
	keys       []int
	vals       map[int]int
	sizes      map[int]int64
}

func (m *model) bytes() int64 {
	var n int64
	for _, k := range m.keys {
		n += m.sizes[k]
	}
	return n
}

func (m *model) remove(k int) {
	if i := slices.Index(m.keys, k); i >= 0 {
		m.keys = slices.Delete(m.keys, i, i+1)
		delete(m.vals, k)
		delete(m.sizes, k)
	}
}

func (m *model) get(k int) (int, bool) {
	i := slices.Index(m.keys, k)
	if i < 0 {
		return 0, false
	}
	m.keys = slices.Delete(m.keys, i, i+1)
	m.keys = slices.Insert(m.keys, 0, k)
	return m.vals[k], true
}

func (m *model) add(k, v int, size int64) {
	m.remove(k)
	if m.maxEntries <= 0 || (m.maxBytes > 0 && size > m.maxBytes) {
		return
	}
	m.keys = slices.Insert(m.keys, 0, k)
	m.vals[k], m.sizes[k] = v, size
	for len(m.keys) > m.maxEntries || (m.maxBytes > 0 && m.bytes() > m.maxBytes) {
		m.remove(m.keys[len(m.keys)-1])
	}
}

func TestRandomAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7919))
		maxEntries := rng.IntN(12) - 1  // -1..10: includes disabled caches
		maxBytes := int64(rng.IntN(60)) // 0 (no bound)..59
		t.Run(fmt.Sprintf("seed%d_e%d_b%d", seed, maxEntries, maxBytes), func(t *testing.T) {
			c := New[int, int](maxEntries, maxBytes)
			m := &model{maxEntries: maxEntries, maxBytes: maxBytes, vals: map[int]int{}, sizes: map[int]int64{}}
			for step := range 3000 {
				k := rng.IntN(16)
				switch op := rng.IntN(10); {
				case op < 4:
					v := rng.Int()
					size := int64(rng.IntN(25))
					c.Add(k, v, size)
					m.add(k, v, size)
				case op < 8:
					gv, gok := c.Get(k)
					mv, mok := m.get(k)
					if gv != mv || gok != mok {
						t.Fatalf("step %d: Get(%d) = %d, %v; model %d, %v", step, k, gv, gok, mv, mok)
					}
				case op < 9:
					c.Remove(k)
					m.remove(k)
				default:
					if rng.IntN(20) == 0 {
						c.Purge()
						m.keys = nil
						clear(m.vals)
						clear(m.sizes)
					}
				}
				checkBounds(t, c, maxEntries, maxBytes)
				if got := c.order(t); !slices.Equal(got, m.keys) {
					t.Fatalf("step %d: order %v, model %v", step, got, m.keys)
				}
				if c.Len() != len(m.keys) || c.Bytes() != m.bytes() {
					t.Fatalf("step %d: Len, Bytes = %d, %d; model %d, %d", step, c.Len(), c.Bytes(), len(m.keys), m.bytes())
				}
			}
		})
	}
}

func TestConcurrentUse(t *testing.T) {
	const maxEntries, maxBytes = 50, 400
	c := New[int, []byte](maxEntries, maxBytes)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for range 5000 {
				k := rng.IntN(100)
				switch rng.IntN(6) {
				case 0, 1:
					size := rng.IntN(30)
					c.Add(k, make([]byte, size), int64(size))
				case 2, 3:
					if v, ok := c.Get(k); ok && len(v) > 30 {
						t.Errorf("Get(%d) returned a %d-byte value", k, len(v))
					}
				case 4:
					c.Remove(k)
				default:
					if c.Len() > maxEntries || c.Bytes() > maxBytes {
						t.Errorf("bounds broken: Len %d, Bytes %d", c.Len(), c.Bytes())
					}
					if rng.IntN(200) == 0 {
						c.Purge()
					}
				}
			}
		})
	}
	wg.Wait()
	checkBounds(t, c, maxEntries, maxBytes)
	c.order(t)
}
