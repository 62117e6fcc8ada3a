package store

// StageWorkers is the number of goroutines that stage a transaction of n writes.
var StageWorkers = stageWorkers
