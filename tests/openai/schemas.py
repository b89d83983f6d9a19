"""JSON schemas the client tests share, whatever API shape wraps them."""

# A weather tool's arguments, bounded so that random weights under the tool-call grammar still
# end in time: a short city and 1 to 7 days.
WEATHER_ARGUMENTS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
