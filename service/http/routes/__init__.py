"""The HTTP routes, one router per area; each route parses, calls one thing, and answers."""
