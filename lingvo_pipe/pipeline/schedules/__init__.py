"""Pipeline schedules as data: per device an ordered list of actions, one pure generator per schedule."""
