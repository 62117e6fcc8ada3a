package store

// Internals the package's external tests assert against; they are not part of the API.
const (
	MaxPlanRounds             = maxPlanRounds
	DefaultOperationRetention = defaultOperationRetention
)
