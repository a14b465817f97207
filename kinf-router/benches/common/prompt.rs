//! The benchmark prompt, shared by `benches/classify.rs` and `examples/classify_calls.rs`.

/// About `tokens` tokens (4 characters each) of mixed prose, code, logs and a few PII values.
pub fn prompt(tokens: usize) -> String {
    const PARTS: &[&str] = &[
        "The quarterly report shows revenue up 12% and churn down to 3.1%; summarise the drivers. ",
        "```python\ndef handler(event):\n    return {\"status\": 200, \"body\": event[\"id\"]}\n```\n",
        "2024-01-15T10:30:00Z INFO worker-3 processed batch 4821 in 1532 ms (v1.27.3)\n",
        "Then compare it with last year's numbers and list three risks? ",
        "Order #1029384756 shipped on 2024-02-11; tracking 1Z999AA10123456784.\n",
        "Request id 550e8400-e29b-41d4-a716-446655440000 failed with a 502 at 10:30:45.\n",
    ];
    let mut s = String::new();
    let mut i = 0;
    while s.len() < tokens * 4 {
        s.push_str(PARTS[i % PARTS.len()]);
        if i % 97 == 50 {
            s.push_str("Contact jane.doe@example.com or +44 20 7946 0958. ");
        }
        i += 1;
    }
    s
}
