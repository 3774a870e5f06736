SELECT alk_floor.enq_v2('bench', '{"to": "user@example.com", "n": 1}'::jsonb);
