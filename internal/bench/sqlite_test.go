package bench

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	_ "modernc.org/sqlite" // database/sql driver "sqlite" (pure Go)

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The alternative our users have: put the outbox in SQLite (WAL, synchronous=FULL),
// or in bbolt. Every row is the same signed record bytes the store writes, signed in
// the timed loop (record.Encode: validate, encode, sign), so the work is the
// same; reads parse and verify what they read with record.Parse, as ours do.

// sqliteDSN opens path in WAL mode with synchronous=FULL (an fsync of the WAL at every
// commit: durable like ours), a busy timeout, and BEGIN IMMEDIATE transactions.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)" +
		"&_pragma=busy_timeout(10000)&_txlock=immediate"
}

// openSQLite opens a fresh SQLite database with one table of records.
func openSQLite(tb testing.TB, path string, conns int) *sql.DB {
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS records (id TEXT PRIMARY KEY, data BLOB NOT NULL)`); err != nil {
		db.Close()
		tb.Fatal(err)
	}
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		db.Close()
		tb.Fatalf("journal_mode %q, %v", mode, err)
	}
	var syncMode int
	if err := db.QueryRow(`PRAGMA synchronous`).Scan(&syncMode); err != nil || syncMode != 2 {
		db.Close()
		tb.Fatalf("synchronous %d, %v (want 2, FULL)", syncMode, err)
	}
	return db
}

// sqliteInsert inserts n freshly signed records in one transaction.
func sqliteInsert(db *sql.DB, n int) error {
	ids := make([]string, n)
	data := make([][]byte, n)
	for i := range n {
		ids[i] = uuid.NewString()
		var err error
		if data[i], err = encodeMessageErr(ids[i]); err != nil {
			return err
		}
	}
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	for i := range n {
		if _, err := tx.Exec(`INSERT INTO records (id, data) VALUES (?, ?)`, ids[i], data[i]); err != nil {
			tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

func benchSQLiteTx(b *testing.B, rows int) {
	db := openSQLite(b, filepath.Join(benchDir(b), "outbox.db"), 1)
	defer db.Close()
	b.ResetTimer()
	for range b.N {
		if err := sqliteInsert(db, rows); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*rows), "records/s")
	reportRate(b, float64(b.N), "tx/s")
}

// BenchmarkSQLiteTx1 is one signed row per transaction, sequentially.
func BenchmarkSQLiteTx1(b *testing.B) { benchSQLiteTx(b, 1) }

// BenchmarkSQLiteTx4 is four signed rows per transaction (the records of a
// two-envelope enqueue: two members, the message, the marker).
func BenchmarkSQLiteTx4(b *testing.B) { benchSQLiteTx(b, 4) }

// BenchmarkSQLiteTx16 is sixteen signed rows per transaction.
func BenchmarkSQLiteTx16(b *testing.B) { benchSQLiteTx(b, groupSize) }

// BenchmarkSQLite8 is one-row transactions from eight goroutines on one database. A
// single connection serializes them in Go (SQLite has one writer at a time; with a
// connection per goroutine the losers sleep in SQLite's busy handler, which measured
// slower here); signing runs in the goroutines, in parallel.
func BenchmarkSQLite8(b *testing.B) {
	db := openSQLite(b, filepath.Join(benchDir(b), "outbox.db"), 1)
	defer db.Close()
	b.ResetTimer()
	runWriters(b, writers, func() error { return sqliteInsert(db, 1) })
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// BenchmarkSQLite8Msg is eight goroutines each committing transactions of three signed
// rows (the outbox member, message record and batch marker of a one-envelope
// message): the work of BenchmarkStoreSenders8 done in SQLite.
func BenchmarkSQLite8Msg(b *testing.B) {
	db := openSQLite(b, filepath.Join(benchDir(b), "outbox.db"), 1)
	defer db.Close()
	b.ResetTimer()
	runWriters(b, writers, func() error { return sqliteInsert(db, 3) })
	b.StopTimer()
	reportRate(b, float64(b.N*3), "records/s")
	reportRate(b, float64(b.N), "tx/s")
}

// BenchmarkSQLite8Conns is BenchmarkSQLite8 with a connection per goroutine (what a
// default database/sql pool gives), for comparison.
func BenchmarkSQLite8Conns(b *testing.B) {
	db := openSQLite(b, filepath.Join(benchDir(b), "outbox.db"), writers)
	defer db.Close()
	b.ResetTimer()
	runWriters(b, writers, func() error { return sqliteInsert(db, 1) })
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

// The read side, on the 10,000 records of the scan fixture loaded into a database.

var (
	sqliteScanOnce sync.Once
	sqliteScanDB   *sql.DB
	sqliteScanErr  error
)

// sqliteScan returns a database holding the scan fixture's 10,000 records (loaded in
// one transaction), opened read-mostly and kept for the whole process.
func sqliteScan(tb testing.TB) (*sql.DB, *scanFixture) {
	f := scanStore(tb)
	sqliteScanOnce.Do(func() {
		db, err := sql.Open("sqlite", sqliteDSN(filepath.Join(cacheRoot, "scan10k.db")))
		if err != nil {
			sqliteScanErr = err
			return
		}
		db.SetMaxOpenConns(4)
		onClose(func() { db.Close() })
		if _, err := db.Exec(`CREATE TABLE records (id TEXT PRIMARY KEY, data BLOB NOT NULL)`); err != nil {
			sqliteScanErr = err
			return
		}
		tx, err := db.Begin()
		if err != nil {
			sqliteScanErr = err
			return
		}
		for i, id := range f.recs.ids {
			if _, err := tx.Exec(`INSERT INTO records (id, data) VALUES (?, ?)`, id, f.recs.data[i]); err != nil {
				tx.Rollback()
				sqliteScanErr = err
				return
			}
		}
		sqliteScanErr = tx.Commit()
		sqliteScanDB = db
	})
	if sqliteScanErr != nil {
		tb.Fatal(sqliteScanErr)
	}
	return sqliteScanDB, f
}

// parse checks a record read from a database exactly as the store checks a file.
func parse(id string, data []byte) error {
	o, key, _ := owner()
	_, err := record.Parse(record.KindMessages, id, data, o.DID(), key)
	return err
}

// BenchmarkSQLiteRead is a point SELECT of one record by id, then a strict parse and
// signature verification of its bytes (a cold read's work; SQLite's page cache warm).
func BenchmarkSQLiteRead(b *testing.B) {
	db, f := sqliteScan(b)
	stmt, err := db.Prepare(`SELECT data FROM records WHERE id = ?`)
	if err != nil {
		b.Fatal(err)
	}
	defer stmt.Close()
	b.ResetTimer()
	for range b.N {
		id := f.recs.ids[rand.IntN(len(f.recs.ids))]
		var data []byte
		if err := stmt.QueryRow(id).Scan(&data); err != nil {
			b.Fatal(err)
		}
		if err := parse(id, data); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "reads/s")
}

// BenchmarkSQLiteList10k selects the 10,000 ids in order.
func BenchmarkSQLiteList10k(b *testing.B) {
	db, _ := sqliteScan(b)
	b.ResetTimer()
	for range b.N {
		rows, err := db.Query(`SELECT id FROM records ORDER BY id`)
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]string, 0, scanRecords)
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				b.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Close(); err != nil || len(ids) != scanRecords {
			b.Fatalf("list: %d ids, %v", len(ids), err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "lists/s")
}

// BenchmarkSQLiteScan10k selects all 10,000 records and parses and verifies them on all
// cores: the work of fsck over the same records.
func BenchmarkSQLiteScan10k(b *testing.B) {
	db, _ := sqliteScan(b)
	b.ResetTimer()
	for range b.N {
		rows, err := db.Query(`SELECT id, data FROM records`)
		if err != nil {
			b.Fatal(err)
		}
		var ids []string
		var data [][]byte
		for rows.Next() {
			var id string
			var d []byte
			if err := rows.Scan(&id, &d); err != nil {
				b.Fatal(err)
			}
			ids, data = append(ids, id), append(data, d)
		}
		if err := rows.Close(); err != nil || len(ids) != scanRecords {
			b.Fatalf("scan: %d rows, %v", len(ids), err)
		}
		if err := onAllCores(len(ids), func(i int) error { return parse(ids[i], data[i]) }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*scanRecords), "records/s")
}

// bbolt: one bucket of records, fsync (fdatasync) at every commit (the default).

var boltBucket = []byte("records")

func openBolt(tb testing.TB, path string) *bolt.DB {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	}); err != nil {
		db.Close()
		tb.Fatal(err)
	}
	return db
}

// boltPut signs n fresh records and Puts them in one transaction, through update
// (db.Update or db.Batch).
func boltPut(update func(func(*bolt.Tx) error) error, n int) error {
	ids := make([]string, n)
	data := make([][]byte, n)
	for i := range n {
		ids[i] = uuid.NewString()
		var err error
		if data[i], err = encodeMessageErr(ids[i]); err != nil {
			return err
		}
	}
	return update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(boltBucket)
		for i := range n {
			if err := bk.Put([]byte(ids[i]), data[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

func benchBolt(b *testing.B, n int) {
	db := openBolt(b, filepath.Join(benchDir(b), "outbox.bolt"))
	defer db.Close()
	b.ResetTimer()
	for range b.N {
		if err := boltPut(db.Update, n); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*n), "records/s")
	reportRate(b, float64(b.N), "tx/s")
}

// BenchmarkBoltPut1 is one signed Put per bbolt transaction.
func BenchmarkBoltPut1(b *testing.B) { benchBolt(b, 1) }

// BenchmarkBoltPut4 is four signed Puts per transaction (a two-envelope enqueue).
func BenchmarkBoltPut4(b *testing.B) { benchBolt(b, 4) }

// BenchmarkBoltPut16 is sixteen signed Puts per transaction.
func BenchmarkBoltPut16(b *testing.B) { benchBolt(b, groupSize) }

// BenchmarkBolt8 is eight goroutines each committing one signed Put through db.Batch,
// bbolt's own group commit (MaxBatchSize set to the eight writers, so a batch starts
// as soon as all of them wait).
func BenchmarkBolt8(b *testing.B) {
	db := openBolt(b, filepath.Join(benchDir(b), "outbox.bolt"))
	defer db.Close()
	db.MaxBatchSize = writers
	b.ResetTimer()
	runWriters(b, writers, func() error { return boltPut(db.Batch, 1) })
	b.StopTimer()
	reportRate(b, float64(b.N), "records/s")
}

var (
	boltScanOnce sync.Once
	boltScanDB   *bolt.DB
	boltScanErr  error
)

// boltScan returns a bbolt database holding the scan fixture's 10,000 records.
func boltScan(tb testing.TB) (*bolt.DB, *scanFixture) {
	f := scanStore(tb)
	boltScanOnce.Do(func() {
		db, err := bolt.Open(filepath.Join(cacheRoot, "scan10k.bolt"), 0o600, &bolt.Options{Timeout: 10 * time.Second})
		if err != nil {
			boltScanErr = err
			return
		}
		onClose(func() { db.Close() })
		boltScanErr = db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucket(boltBucket)
			if err != nil {
				return err
			}
			for i, id := range f.recs.ids {
				if err := bk.Put([]byte(id), f.recs.data[i]); err != nil {
					return err
				}
			}
			return nil
		})
		boltScanDB = db
	})
	if boltScanErr != nil {
		tb.Fatal(boltScanErr)
	}
	return boltScanDB, f
}

// BenchmarkBoltRead is a Get of one record in a read transaction, copied out, parsed
// and verified.
func BenchmarkBoltRead(b *testing.B) {
	db, f := boltScan(b)
	b.ResetTimer()
	for range b.N {
		id := f.recs.ids[rand.IntN(len(f.recs.ids))]
		var data []byte
		if err := db.View(func(tx *bolt.Tx) error {
			v := tx.Bucket(boltBucket).Get([]byte(id))
			if v == nil {
				return fmt.Errorf("%s missing", id)
			}
			data = append([]byte(nil), v...)
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if err := parse(id, data); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "reads/s")
}

// BenchmarkBoltList10k walks the 10,000 keys in order with a cursor.
func BenchmarkBoltList10k(b *testing.B) {
	db, _ := boltScan(b)
	b.ResetTimer()
	for range b.N {
		ids := make([]string, 0, scanRecords)
		if err := db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(boltBucket).Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				ids = append(ids, string(k))
			}
			return nil
		}); err != nil || len(ids) != scanRecords {
			b.Fatalf("list: %d ids, %v", len(ids), err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N), "lists/s")
}

// BenchmarkBoltScan10k walks the 10,000 records and parses and verifies them on all
// cores.
func BenchmarkBoltScan10k(b *testing.B) {
	db, _ := boltScan(b)
	b.ResetTimer()
	for range b.N {
		var ids []string
		var data [][]byte
		if err := db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(boltBucket).Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				ids, data = append(ids, string(k)), append(data, append([]byte(nil), v...))
			}
			return nil
		}); err != nil || len(ids) != scanRecords {
			b.Fatalf("scan: %d records, %v", len(ids), err)
		}
		if err := onAllCores(len(ids), func(i int) error { return parse(ids[i], data[i]) }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N*scanRecords), "records/s")
}
