package agent

// RenewTime exposes renewTime to the external tests.
var RenewTime = renewTime

// OverdueWait exposes overdueWait to the external tests.
var OverdueWait = overdueWait
