// Package lru is a small bounded least-recently-used cache, bounded both by a number of
// entries and by a total of caller-declared byte sizes (DESIGN §8, verified-record LRU).
//
// Values are stored exactly as given and returned as stored: the cache never copies
// them. A caller that needs an independent copy must make it. The store keeps only
// immutable values in the cache and copies on the way out, so no caller ever shares
// mutable state through it.
//
// A Cache is safe for concurrent use by multiple goroutines.
package lru

import "sync"

// Cache is a bounded LRU cache from K to V. The zero value is not usable; use New.
type Cache[K comparable, V any] struct {
	mu         sync.Mutex
	maxEntries int
	maxBytes   int64
	bytes      int64
	items      map[K]*entry[K, V]
	// root is the sentinel of a circular doubly-linked list: root.next is the most
	// recently used entry, root.prev the least recently used.
	root entry[K, V]
}

type entry[K comparable, V any] struct {
	prev, next *entry[K, V]
	key        K
	value      V
	size       int64
}

// New returns a cache holding at most maxEntries entries whose sizes add up to at most
// maxBytes. maxEntries <= 0 disables caching (Add stores nothing); maxBytes <= 0 means
// no byte bound.
func New[K comparable, V any](maxEntries int, maxBytes int64) *Cache[K, V] {
	c := &Cache[K, V]{maxEntries: maxEntries, maxBytes: maxBytes, items: make(map[K]*entry[K, V])}
	c.root.next = &c.root
	c.root.prev = &c.root
	return c
}

func (c *Cache[K, V]) unlink(e *entry[K, V]) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

func (c *Cache[K, V]) pushFront(e *entry[K, V]) {
	e.prev = &c.root
	e.next = c.root.next
	c.root.next.prev = e
	c.root.next = e
}

func (c *Cache[K, V]) removeEntry(e *entry[K, V]) {
	c.unlink(e)
	delete(c.items, e.key)
	c.bytes -= e.size
}

// Get returns the value cached for k and marks it most recently used.
func (c *Cache[K, V]) Get(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.unlink(e)
	c.pushFront(e)
	return e.value, true
}

// Add caches v under k with the given size (in bytes; a negative size counts as 0),
// replacing any entry for k, and then evicts least-recently-used entries until both
// bounds hold. An entry larger than maxBytes is not cached (and any older entry for k
// is dropped, so a stale value is never served).
func (c *Cache[K, V]) Add(k K, v V, size int64) {
	size = max(size, 0)
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.items[k]; ok {
		c.removeEntry(old)
	}
	if c.maxEntries <= 0 || (c.maxBytes > 0 && size > c.maxBytes) {
		return
	}
	e := &entry[K, V]{key: k, value: v, size: size}
	c.pushFront(e)
	c.items[k] = e
	c.bytes += size
	for len(c.items) > c.maxEntries || (c.maxBytes > 0 && c.bytes > c.maxBytes) {
		c.removeEntry(c.root.prev)
	}
}

// Remove drops the entry for k, if any.
func (c *Cache[K, V]) Remove(k K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[k]; ok {
		c.removeEntry(e)
	}
}

// Len returns the number of cached entries.
func (c *Cache[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items)
}

// Bytes returns the total size of the cached entries.
func (c *Cache[K, V]) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Purge drops every entry.
func (c *Cache[K, V]) Purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	// The old entries are referenced only by one another now: the collector frees
	// them, links and all.
	c.root.next = &c.root
	c.root.prev = &c.root
	c.items = make(map[K]*entry[K, V])
	c.bytes = 0
}
